package Test::Nginx::Socket;

# A small stand-in for Test::Nginx::Socket (openresty/test-nginx 0.33), used
# only when the real module is not installed: t/runner is put on @INC just
# then.  It reads the same .t format and behaves like the real one for the
# subset our suite uses, so every .t file stays valid for the real tool.
# Written from the tool's documentation and observed behaviour (see
# shared/research/test-nginx-format.md), not from its source.  POD at the end.

use strict;
use warnings;

use Test::Base ();          # subclassed below, as the real module does
use Test::More ();
use Cwd qw(cwd);
use File::Path qw(make_path remove_tree);
use IO::Select;
use IO::Socket::INET;
use List::Util qw(min shuffle);
use POSIX qw(WNOHANG);
use Time::HiRes qw(sleep time);

our $VERSION = '0.33';     # the version whose format this follows
our @ISA = ('Test::Base');  # Test::Base's import handles plans and exports
our @EXPORT = qw(
    run_tests no_shuffle repeat_each log_level master_on master_off
    no_root_location server_root html_dir server_port worker_connections
    env_to_nginx add_block_preprocessor bail_out timeout
    check_accum_error_log no_long_string workers
);

our %RandPorts;              # $TEST_NGINX_RAND_PORT_N of the current block
our $RepeatEach        = 1;
our $NoShuffle         = $ENV{TEST_NGINX_NO_SHUFFLE} || 0;
our $LogLevel          = $ENV{TEST_NGINX_LOG_LEVEL} || 'debug';
our $MasterProcess     = $ENV{TEST_NGINX_MASTER_PROCESS} || 'off';
our $WorkerConnections = $ENV{TEST_NGINX_WORKER_CONNECTIONS} || 64;
our $Workers           = 1;
our $Timeout           = $ENV{TEST_NGINX_TIMEOUT} || 3;
our $Sleep             = $ENV{TEST_NGINX_SLEEP} || 0.015;
our $UseValgrind       = $ENV{TEST_NGINX_USE_VALGRIND};
our $ServerPort = $ENV{TEST_NGINX_SERVER_PORT} || $ENV{TEST_NGINX_PORT} || 1984;
our $ServRoot   = $ENV{TEST_NGINX_SERVROOT} || cwd() . '/t/servroot';
my $RandomRoot;                     # TEST_NGINX_RANDOMIZE: ours to delete
if ($ENV{TEST_NGINX_RANDOMIZE}) {
    $ServerPort = free_port();
    $ServRoot = $RandomRoot = cwd() . "/t/servroot_$ServerPort"
        unless $ENV{TEST_NGINX_SERVROOT};
}
our $NoRootLocation   = 0;
our $CheckAccumErrLog = 0;

my (@EnvToNginx, @Preprocessors);
my ($NginxBinary, $NginxV, $PrevConf);
our $NginxVersion;                  # 1.025001 for nginx 1.25.1, as the tool's
my ($NginxPid, $ChildPid);          # ChildPid: valgrind mode, our own child
my ($ErrLogPos, $AccLogPos) = (0, 0);

# Sections the real tool has but this runner does not: refuse them loudly
# rather than let a test pass here and mean something else there.
my @Unsupported = qw(
    tcp_listen tcp_reply udp_listen udp_reply stap stap_out stap_out_like
    stap_out_unlike shutdown_error_log no_shutdown_error_log
    skip_nginx2 skip_openssl skip_slave todo todo_nginx response_body_filters
    response_body_json_sort charset http09 curl server_addr_for_client
    http2 http3 server_name post_setup_server_root error_log_file
    raw_request_middle_delay request_eval response_body_eval
);

sub no_shuffle ()          { $NoShuffle = 1 }
sub repeat_each (@)        { @_ ? ($RepeatEach = shift) : $RepeatEach }
sub log_level (@)          { @_ ? ($LogLevel = shift) : $LogLevel }
sub master_on ()           { $MasterProcess = 'on' }
sub master_off ()          { $MasterProcess = 'off' }
sub no_root_location ()    { $NoRootLocation = 1 }
sub server_root ()         { $ServRoot }
sub html_dir ()            { "$ServRoot/html" }
sub server_port (@)        { @_ ? ($ServerPort = shift) : $ServerPort }
sub worker_connections (@) { @_ ? ($WorkerConnections = shift) : $WorkerConnections }
sub workers (@)            { @_ ? ($Workers = shift) : $Workers }
sub timeout (@)            { @_ ? ($Timeout = shift) : $Timeout }
sub env_to_nginx (@)       { push @EnvToNginx, @_ }
sub add_block_preprocessor (&) { unshift @Preprocessors, shift }
sub check_accum_error_log ()   { $CheckAccumErrLog = 1 }
sub no_long_string ()      { }

sub bail_out (@) {
    stop_nginx();
    Test::More::BAIL_OUT(join '', @_);
}

sub run_tests () {
    find_nginx();
    $ENV{TEST_NGINX_SERVER_PORT} = $ServerPort;
    $ENV{TEST_NGINX_SERVER_ROOT} = $ServRoot;
    my @blocks = Test::Base::blocks();
    @blocks = shuffle @blocks unless $NoShuffle;
    for my $block (@blocks) {
        $_->($block) for @Preprocessors;
        run_block($block);
    }
}

# ---------------------------------------------------------------- blocks

sub run_block {
    my ($block) = @_;
    my $name = $block->name;

    for my $s (@Unsupported) {
        bail_out("$name - section --- $s is not supported by t/runner "
                 . "(install the real Test::Nginx)")
            if defined $block->{$s};
    }
    # As in the real tool: a skipped block starts no nginx but its --- init
    # still runs (so init must not need what skip_eval tests for).
    if (skip_block($block)) {
        run_init($block);
        return;
    }

    # each distinct $TEST_NGINX_RAND_PORT_N is one free port for this block;
    # only the generated files see them (never %ENV), as in the real tool,
    # which keeps them in $Test::Nginx::Util::RandPorts
    my %rand;
    for my $k (grep { !/^_/ && ref $block->{$_} eq 'ARRAY' } keys %$block) {
        for my $v (map { ref eq 'ARRAY' ? @$_ : $_ } @{ $block->{$k} }) {
            next if !defined $v || ref $v;
            for my $var ($v =~ /\$(TEST_NGINX_RAND_PORT_[0-9]+)/g) {
                $rand{$var} //= free_port(values %rand);
            }
        }
    }
    %RandPorts = %rand;
    $Test::Nginx::Util::RandPorts = \%RandPorts;

    if (defined $block->config) {
        return run_must_die($block) if defined $block->must_die;
        start_nginx($block);
    } elsif (!$NginxPid) {
        bail_out("$name - No '--- config' section specified and no nginx"
                 . " is running from a previous block");
    }

    run_init($block);

    ($ErrLogPos, $AccLogPos) = (0, 0);
    run_requests($block, $_) for 0 .. $RepeatEach - 1;

    if (my $total = $ENV{TEST_NGINX_ERROR_LOG}) {
        if (open my $in, '<:raw', "$ServRoot/logs/error.log") {
            open my $out, '>>:raw', $total or bail_out("Can't open $total: $!");
            print $out "=== $0 $name\n", <$in>;
        }
    }
}

# --- init and --- skip_eval code runs where the real tool runs it: in
# package Test::Nginx::Util (not main), so an `our` variable it declares is
# $Test::Nginx::Util::x there; the runner's functions are visible in it.
sub eval_in_util {
    my ($code) = @_;
    ## no critic (ProhibitStringyEval)
    return eval "package Test::Nginx::Util;\n$code";
}

sub run_init {
    my ($block) = @_;
    return unless defined $block->init;
    # as there, only $@ counts: init may `return` (from the eval) early
    eval_in_util($block->init);
    bail_out($block->name . " - init failed: $@") if $@;
}

# --- skip_eval: N: <perl expr>   (the real tool's syntax)
# --- skip_nginx: N: <|<=|>|>= 1.25.0[: reason]   (nginx's version)
sub skip_block {
    my ($block) = @_;
    my $name = $block->name;
    my ($n, $skip, $why);
    if (defined(my $spec = $block->skip_eval)) {
        $spec =~ /^\s*(\d+)\s*:\s*(.*?)\s*$/s
            or bail_out("$name - Invalid --- skip_eval spec: $spec");
        ($n, $why) = ($1, 'skip_eval');
        my $code = $2;
        $skip = eval_in_util($code);
        bail_out("$name - skip_eval failed: $@") if $@;
    }
    if (defined(my $spec = $block->skip_nginx)) {
        $spec =~ /^\s*(\d+)\s*:\s*([<>]=?)\s*(\d+)\.(\d+)\.(\d+)
                  (?:\s*:\s*(.*?))?\s*$/sx
            or bail_out("$name - Invalid --- skip_nginx spec: $spec");
        $n = $1;
        my ($op, $ver) = ($2, sprintf '%d.%03d%03d', $3, $4, $5);
        $why = $6 || "nginx version $op $3.$4.$5";
        ## no critic (ProhibitStringyEval)
        $skip = 1 if eval "$NginxVersion $op $ver";
    }
    return 0 unless $skip;
    SKIP: { Test::More::skip("$name - $why", $n) }
    return 1;
}

sub run_must_die {
    my ($block) = @_;
    my $name = $block->name;
    my $want = $block->must_die;
    stop_nginx();
    setup_servroot();
    write_user_files($block);
    write_file("$ServRoot/conf/nginx.conf", gen_config($block, 1));
    $ErrLogPos = 0;
    for my $rep (0 .. $RepeatEach - 1) {
        my $rc = run_cmd([nginx_cmd()], "$ServRoot/logs/stderr.log", 1);
        if ($rc & 127) {
            Test::More::fail("$name - nginx died of signal " . ($rc & 127));
        } elsif ($want =~ /^\s*(\d+)\s*$/) {
            my $code = $1;
            Test::More::is($rc >> 8, $code, "$name - die with the expected exit code");
        } else {
            Test::More::isnt($rc, 0, "$name - die as expected");
        }
        if ($rc == 0) {     # it started after all: don't leave it running
            $NginxPid = wait_pid_file($name);
            stop_nginx();
        }
        check_logs($block, $rep);
    }
}

# ---------------------------------------------------------------- nginx

sub find_nginx {
    return if $NginxBinary;
    my $bin = $ENV{TEST_NGINX_BINARY} || 'nginx';
    if ($bin !~ m{/}) {
        my ($found) = grep { -x "$_/$bin" } split /:/, $ENV{PATH} || '';
        $bin = $found ? "$found/$bin"
             : -x "/usr/sbin/$bin" ? "/usr/sbin/$bin" : $bin;
    }
    $NginxV = `'$bin' -V 2>&1`;
    bail_out("Cannot run the nginx executable \"$bin\"")
        if !defined $NginxV || $? != 0;
    $NginxV =~ m{nginx/(\d+)\.(\d+)\.(\d+)}
        or bail_out("Cannot parse the output of \"$bin -V\": $NginxV");
    $NginxVersion = sprintf '%d.%03d%03d', $1, $2, $3;
    $NginxBinary = $bin;
}

sub nginx_cmd {
    return ($NginxBinary, '-p', "$ServRoot/", '-c', "$ServRoot/conf/nginx.conf",
            $NginxVersion >= 1.019005 ? ('-e', "$ServRoot/logs/error.log") : ());
}

sub expand_env {
    my ($s) = @_;
    return $s if !defined $s || ref $s;
    $s =~ s{\$(TEST_NGINX_[_A-Z0-9]+)}{
        defined $RandPorts{$1} ? $RandPorts{$1}
      : defined $ENV{$1} ? $ENV{$1}
                         : bail_out("No environment $1 defined.\n")
    }ge;
    return $s;
}

# The skeleton and its order follow the real tool's generated nginx.conf.
sub gen_config {
    my ($block, $must_die) = @_;
    my $r = $ServRoot;
    my ($main, $http, $server, $post) = map { expand_env($block->$_ // '') }
        qw(main_config http_config config post_main_config);
    my $level = $block->log_level // $LogLevel;
    $level =~ s/^\s+|\s+$//g;
    my $fg = $UseValgrind && !$must_die;    # valgrind needs the foreground
    my $conf = "worker_processes  $Workers;\n"
        . 'daemon ' . ($fg ? 'off' : 'on') . ";\n"
        . 'master_process ' . ($fg ? 'off' : $MasterProcess) . ";\n"
        . "error_log $r/logs/error.log $level;\n"
        . "pid       $r/logs/nginx.pid;\n";
    $conf .= "env $_;\n" for qw(MOCKEAGAIN_VERBOSE MOCKEAGAIN
        MOCKEAGAIN_WRITE_TIMEOUT_PATTERN LD_PRELOAD LD_LIBRARY_PATH
        DYLD_INSERT_LIBRARIES DYLD_FORCE_FLAT_NAMESPACE), @EnvToNginx;
    $conf .= "load_module $_;\n"
        for split ' ', $ENV{TEST_NGINX_LOAD_MODULES} // '';
    $conf .= "\n$main\n\nhttp {\n    access_log $r/logs/access.log;\n";
    for my $t (qw(client_body proxy fastcgi uwsgi scgi)) {
        next if $http =~ /\b${t}_temp_path\b/
             || $NginxV =~ /--without-http_${t}_module/;
        $conf .= "    ${t}_temp_path $r/${t}_temp;\n";
    }
    # The real tool writes "listen <port>" (all interfaces); this workplace
    # only allows loopback, so ours binds 127.0.0.1 - the client connects
    # there in both.
    $conf .= "    default_type text/plain;\n    keepalive_timeout  68000ms;\n"
        . "\n$http\n\n    server {\n"
        . "        listen          127.0.0.1:$ServerPort;\n"
        . "        server_name     'localhost';\n\n"
        . "        client_max_body_size 30M;\n\n$server\n";
    $conf .= "        location / {\n            root $r/html;\n"
        . "            index index.html index.htm;\n        }\n"
        unless $NoRootLocation;
    $conf .= "    }\n}\n\n$post\n\nevents {\n    accept_mutex off;\n"
        . "    worker_connections  $WorkerConnections;\n";
    $conf .= "    use $ENV{TEST_NGINX_EVENT_TYPE};\n" if $ENV{TEST_NGINX_EVENT_TYPE};
    $conf .= "}\n";
    $conf .= "user $ENV{TEST_NGINX_WORKER_USER};\n" if $ENV{TEST_NGINX_WORKER_USER};
    return $conf;
}

sub setup_servroot {
    if (-d $ServRoot) {
        opendir my $dh, $ServRoot or bail_out("Can't open $ServRoot: $!");
        my @gen = grep { /^(conf|html|logs|cache)$|_(temp|cache)$/ } readdir $dh;
        remove_tree(map { "$ServRoot/$_" } @gen);
        # like the real tool: refuse to wipe a misused TEST_NGINX_SERVROOT
        rmdir $ServRoot or bail_out("Can't remove $ServRoot (not empty?)");
    }
    make_path(map { "$ServRoot/$_" } qw(conf html logs));
    write_file("$ServRoot/html/index.html", '<html><head><title>It works!'
        . '</title></head><body>It works!</body></html>');
}

# --- user_files: ">>> name [touch-timestamp]" lines start files under html/
# (or at an absolute path); an eval may also give [[name, body], ...].
sub write_user_files {
    my ($block) = @_;
    my $spec = $block->user_files;
    return unless defined $spec;
    my @files;
    if (ref $spec eq 'ARRAY') {
        @files = map { [@$_] } @$spec;
    } else {
        for my $line (split /^/m, expand_env($spec)) {
            if ($line =~ /^>>> (\S+)(?:[ \t]+(.+?))?\s*$/) {
                push @files, [$1, '', $2];
            } elsif (@files) {
                $files[-1][1] .= $line;
            }
        }
    }
    for my $f (@files) {
        my ($fname, $body, $date) = @$f;
        my $path = $fname =~ m{^/} ? $fname : "$ServRoot/html/$fname";
        make_path($1) if $path =~ m{(.*)/} && !-d $1;
        write_file($path, $body // '');
        if ($date) {
            local $ENV{TZ} = 'GMT';
            system('touch', '-t', $date, $path) == 0
                or bail_out($block->name . " - touch -t $date failed");
        }
    }
}

sub start_nginx {
    my ($block) = @_;
    my $name = $block->name;
    my $conf = gen_config($block, 0);

    if (defined $ENV{TEST_NGINX_FORCE_RESTART_ON_TEST}
        && !$ENV{TEST_NGINX_FORCE_RESTART_ON_TEST} && $NginxPid
        && defined $PrevConf && $PrevConf eq $conf
        && !defined $block->user_files)
    {
        return;
    }

    stop_nginx($name);
    setup_servroot();
    write_user_files($block);
    write_file("$ServRoot/conf/nginx.conf", $conf);
    $PrevConf = $conf;
    my @cmd = nginx_cmd();

    if ($UseValgrind) {
        my @vg = ('valgrind', '-q');
        if ($UseValgrind =~ /^\d+$/) {
            push @vg, qw(--tool=memcheck --leak-check=full --keep-debuginfo=yes
                         --show-possibly-lost=no --gen-suppressions=all
                         --num-callers=100);
            push @vg, '--suppressions=valgrind.suppress' if -f 'valgrind.suppress';
        } else {
            push @vg, split ' ', $UseValgrind;
        }
        push @vg, '--exit-on-first-error=yes', '--error-exitcode=1'
            if $ENV{TEST_NGINX_VALGRIND_EXIT_ON_FIRST_ERR};
        my $log = $ENV{TEST_NGINX_VALGRIND_LOG};
        if ($log) {
            open my $out, '>>', $log or bail_out("Can't open $log: $!");
            print $out "=== $0 $name\n";
        } else {
            warn "$name\n";
        }
        $ChildPid = run_cmd([@vg, @cmd], $log, 0);
        $NginxPid = $ChildPid;
        wait_listening($name, 30);
        return;
    }

    my $errfile = "$ServRoot/logs/stderr.log";
    my $rc = run_cmd(\@cmd, $errfile, 1);
    my $stderr = read_file($errfile);
    print STDERR $stderr if length $stderr;
    bail_out("$name - Cannot start nginx using command \"@cmd\".\n$stderr")
        if $rc != 0;
    $NginxPid = wait_pid_file($name);
    wait_listening($name, 5);
}

# Runs a command with stdout to /dev/null and stderr appended to a file (if
# given).  Waits and returns $? if $wait, else returns the child's pid.
sub run_cmd {
    my ($cmd, $errfile, $wait) = @_;
    my $pid = fork;
    bail_out("fork() failed: $!") unless defined $pid;
    if ($pid == 0) {
        open STDOUT, '>', '/dev/null';
        open STDERR, '>>', $errfile if $errfile;
        exec { $cmd->[0] } @$cmd;
        warn "Can't exec $cmd->[0]: $!\n";
        POSIX::_exit(127);
    }
    return $pid unless $wait;
    waitpid $pid, 0;
    return $?;
}

sub wait_pid_file {
    my ($name) = @_;
    my $file = "$ServRoot/logs/nginx.pid";
    for (1 .. 500) {
        my $pid = read_file($file);
        return $1 if $pid =~ /^(\d+)\s*$/;
        sleep 0.01;
    }
    bail_out("$name - nginx wrote no pid file; its error.log ends with:\n"
             . tail_error_log());
}

# Polls /proc/net/tcp rather than connecting, so that no probe connection
# shows up in error.log; with daemon on the socket already listens when the
# nginx command returns, so this is mostly for valgrind's slow start.
sub wait_listening {
    my ($name, $secs) = @_;
    my $hex = sprintf ':%04X', $ServerPort;
    my $deadline = time + $secs;
    while (time < $deadline) {
        return unless open my $fh, '<', '/proc/net/tcp';   # can't tell: go on
        while (<$fh>) {
            my @f = split;
            return if @f > 3 && substr($f[1], -5) eq $hex && $f[3] eq '0A';
        }
        if ($ChildPid && waitpid($ChildPid, WNOHANG) == $ChildPid) {
            undef $ChildPid;
            undef $NginxPid;
            bail_out("$name - nginx exited during startup:\n" . tail_error_log());
        }
        sleep 0.02;
    }
    bail_out("$name - nginx is not listening on 127.0.0.1:$ServerPort after"
             . " $secs s:\n" . tail_error_log());
}

sub tail_error_log {
    my @lines = split /^/m, read_file("$ServRoot/logs/error.log");
    return join '', @lines[ ($#lines > 20 ? $#lines - 20 : 0) .. $#lines ];
}

sub is_alive {
    my ($pid) = @_;
    return waitpid($pid, WNOHANG) == 0 if $ChildPid && $pid == $ChildPid;
    # a daemon is not our child: if init doesn't reap it, it stays a zombie
    return kill(0, $pid) && read_file("/proc/$pid/stat") !~ /^\d+ \(.*\) Z/s;
}

# Stops the nginx we started (QUIT, or TERM with TEST_NGINX_FAST_SHUTDOWN),
# waits a bounded time for it to exit, then kills it.  A pid file left by an
# earlier run is honoured only if that process is an nginx of this servroot.
sub stop_nginx {
    my ($name) = @_;
    my $pid = $NginxPid;
    if (!$pid && read_file("$ServRoot/logs/nginx.pid") =~ /^(\d+)/) {
        my ($stale, $cmd) = ($1, read_file("/proc/$1/cmdline"));
        $pid = $stale if $cmd =~ /nginx/ && index($cmd, $ServRoot) >= 0;
    }
    undef $NginxPid;
    if ($pid && is_alive($pid)) {
        kill $ENV{TEST_NGINX_FAST_SHUTDOWN} ? 'TERM' : 'QUIT', $pid;
        my $deadline = time + ($ChildPid ? 60 : 5);
        sleep 0.005 while is_alive($pid) && time < $deadline;
        if (is_alive($pid)) {
            warn 'WARNING: ' . ($name ? "$name - " : '')
                 . "killing nginx $pid with force...\n";
            kill 'KILL', $pid;
            waitpid $pid, 0 if $ChildPid;
            for (1 .. 200) { last unless is_alive($pid); sleep 0.01 }
        }
    }
    undef $ChildPid;
}

END {
    local $?;
    if ($NginxBinary && !$ENV{TEST_NGINX_NO_CLEAN}) {
        stop_nginx();
        remove_tree($RandomRoot) if $RandomRoot;
    }
}

# ---------------------------------------------------------------- requests

sub run_requests {
    my ($block, $rep) = @_;
    my $name = $block->name;
    my @reqs = build_requests($block);
    my $timeout = parse_time($block->timeout) // $Timeout;
    my $need_array = defined $block->pipelined_requests || @reqs > 1;
    my $idx = 0;

    for my $i (0 .. $#reqs) {
        my $raw = send_request($block, $reqs[$i], $timeout);
        for my $k (1 .. $reqs[$i]{responses}) {
            if (!defined $block->ignore_response) {
                my ($res, $left) = parse_response($name, $raw, $reqs[$i]{head});
                check_response($block, $res, $idx, $rep, $need_array);
                if ($reqs[$i]{responses} > 1) {
                    $raw = $left // '';
                } elsif (defined $left) {
                    (my $show = $left) =~ s/([^\x20-\x7e])/sprintf '\x{%02x}', ord $1/ge;
                    warn "WARNING: $name - unexpected extra bytes after last"
                         . " chunk in response: \"$show\"\n";
                }
            }
            # like the real tool, logs are checked after every response
            if ($i < $#reqs || $k < $reqs[$i]{responses}) {
                sleep $block->wait if $block->wait;
                check_logs($block, $rep);
            }
            $idx++;
        }
    }
    sleep $block->wait if $block->wait;
    check_logs($block, $rep);
}

sub parse_time {
    my ($t) = @_;
    return undef unless defined $t;
    return $1 / 1000 if $t =~ /^\s*([\d.]+)\s*ms\s*$/;
    return $1 if $t =~ /^\s*([\d.]+)\s*s?\s*$/;
    return $t;
}

# Returns a list of { packets => [{value, delay_before}], responses => N,
# head => bool }, one per connection.
sub build_requests {
    my ($block) = @_;
    my $name = $block->name;
    my $more = $block->more_headers;
    my $hdr = sub {
        my ($i) = @_;
        return $more // '' unless ref $more eq 'ARRAY';
        return $more->[$i]
            // bail_out("$name - --- more_headers lacks data for request $i");
    };

    if (defined(my $raw = $block->raw_request)) {
        my @p = ref $raw eq 'ARRAY' ? @$raw : ($raw);
        return { packets => [map { { value => $_ } } @p], responses => 1,
                 head => scalar join('', @p) =~ /^\s*HEAD\s/ };
    }

    if (defined(my $pipe = $block->pipelined_requests)) {
        bail_out("$name - invalid entries in --- pipelined_requests")
            unless ref $pipe eq 'ARRAY';
        my $all = '';
        for my $i (0 .. $#$pipe) {
            $all .= make_request($name, expand_env($pipe->[$i]), $hdr->($i),
                                 $i == $#$pipe ? 'close' : 'keep-alive');
        }
        return { packets => [{ value => $all }], responses => scalar @$pipe };
    }

    my $req = $block->request;
    bail_out("$name - request empty") unless defined $req;
    if (!ref $req) {
        1 while $req =~ s/^\s*#[^\n]+\s+|^\s+//s;   # leading comments, blanks
        $req = [$req];
    }
    bail_out("$name - invalid --- request: MUST be string or array of requests")
        unless ref $req eq 'ARRAY';
    my @out;
    for my $i (0 .. $#$req) {
        my $one = $req->[$i];
        if (!ref $one) {
            push @out, { packets => [{ value => make_request($name, $one,
                                       $hdr->($i), 'close') }],
                         responses => 1, head => scalar $one =~ /^\s*HEAD\s/ };
            next;
        }
        bail_out("$name - a request must be a string or an array of packets")
            unless ref $one eq 'ARRAY';
        # Packets: the headers are added to the whole request, then every
        # packet but the first keeps its length, counted from the end.
        my @p = map { ref $_ ? $_ : { value => $_ } } @$one;
        my $whole = make_request($name, join('', map { $_->{value} } @p),
                                 $hdr->($i), 'close');
        my @packets;
        for my $j (reverse 1 .. $#p) {
            my $len = min(length $p[$j]{value}, length $whole);
            unshift @packets, { %{ $p[$j] }, value => substr($whole, -$len) };
            substr($whole, -$len) = '' if $len;
        }
        unshift @packets, { %{ $p[0] }, value => $whole };
        push @out, { packets => \@packets, responses => 1,
                     head => scalar $packets[0]{value} =~ /^\s*HEAD\s/ };
    }
    return @out;
}

# "METHOD [uri [HTTP/x.y]]\n[body]" plus --- more_headers, made into a full
# request the way the real tool does: Host and Connection are added unless
# given, Content-Length counts the body with its outer whitespace trimmed.
sub make_request {
    my ($name, $raw, $more, $conn) = @_;
    my ($first, $body) = split /\n/, $raw // '', 2;
    $body //= '';
    $first =~ /^\s*(\S+) *(?:(\S+) *)?(?:(\S+) *)?\s*$/
        or bail_out("$name - Request line is not valid. Should be"
                    . " 'meth [url [version]]' but got \"$first\".");
    my ($meth, $url, $ver) = ($1, $2 // '/', $3 // 'HTTP/1.1');

    my ($hdrs, $chunked) = ('', 0);
    for my $line (split /\n+/, $more) {
        next if $line =~ /^\s*#/;
        my ($k, $v) = split /:\s*/, $line, 2;
        $v //= '';
        $chunked = 1 if lc $k eq 'transfer-encoding' && $v eq 'chunked';
        $hdrs .= "$k: $v\r\n";
    }
    my $len = '';
    if (!$chunked && $body ne '' && $hdrs !~ /(?:^|\n)Content-Length:/) {
        $body =~ s/^\s+|\s+$//g;
        $len = 'Content-Length: ' . length($body) . "\r\n";
    }
    my $std = '';
    $std .= "Host: localhost\r\n" if $hdrs !~ /(?:^|\n)Host:/i;
    $std .= "Connection: $conn\r\n" if $hdrs !~ /(?:^|\n)Connection/i;
    return "$meth $url $ver\r\n$std$hdrs$len\r\n$body";
}

# One connection: write the packets, read until the server closes.  The
# timeout applies to each wait for the socket, as in the real tool.
sub send_request {
    my ($block, $req, $timeout) = @_;
    my $name = $block->name;
    local $SIG{PIPE} = 'IGNORE';
    my $port = $ENV{TEST_NGINX_CLIENT_PORT} || $ServerPort;
    my ($sock, $deadline) = (undef, time + ($UseValgrind ? 10 : 2));
    until ($sock = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
              PeerPort => $port, Proto => 'tcp', Timeout => $timeout))
    {
        if (time > $deadline) {
            Test::More::fail("$name - Can't connect to 127.0.0.1:$port: $!"
                             . " (aborted)");
            return '';
        }
        sleep 0.05;
    }
    $sock->blocking(0);
    my $sel = IO::Select->new($sock);
    my ($resp, $timed_out) = ('', 0);

    WRITE: for my $p (@{ $req->{packets} }) {
        sleep $p->{delay_before} if $p->{delay_before};
        my $buf = $p->{value};
        while (length $buf) {
            if (!$sel->can_write($timeout)) { $timed_out = 1; last WRITE }
            my $n = syswrite $sock, $buf;
            if (!defined $n) {
                next if $!{EAGAIN} || $!{EINTR};
                last WRITE;             # e.g. nginx answered early and closed
            }
            substr($buf, 0, $n) = '';
        }
    }
    if (!$timed_out && defined(my $how = $block->shutdown)) {
        shutdown $sock, $how =~ /(\d)/ ? $1 : 1;
    }
    while (!$timed_out) {
        if (!$sel->can_read($timeout)) { $timed_out = 1; last }
        my $n = sysread $sock, my $buf, 65536;
        if (!defined $n) {
            next if $!{EAGAIN} || $!{EINTR};
            last;
        }
        last if $n == 0;
        $resp .= $buf;
    }
    close $sock;
    Test::More::fail("ERROR: client socket timed out - $name\n")
        if $timed_out && !defined $block->abort;
    return $resp;
}

# Returns ({code, headers => [[lc name, value]...], raw_headers, body}, left)
# where left is whatever follows this response (pipelining).
sub parse_response {
    my ($name, $raw, $head_req) = @_;
    my $res = { code => undef, headers => [], raw_headers => '', body => undef };
    return ($res, undef) unless length $raw;
    my $end = index $raw, "\r\n\r\n";
    my $rest = '';
    if ($end < 0) {
        $res->{raw_headers} = $raw;
    } else {
        $res->{raw_headers} = substr $raw, 0, $end + 2;
        $rest = substr $raw, $end + 4;
    }
    my ($status, @lines) = split /\r\n/, $res->{raw_headers};
    $res->{code} = $1 if $status =~ m{^HTTP/[\d.]+\s+(\d+)};
    for (@lines) {
        push @{ $res->{headers} }, [lc $1, $2] if /^([^:\s]+)\s*:\s*(.*?)\s*$/;
    }
    my $te = header($res, 'transfer-encoding');
    my $cl = header($res, 'content-length');
    my $left;
    if ($head_req || ($res->{code} // '') =~ /^(?:1..|204|304)$/) {
        $res->{body} = '';
        $left = $rest if length $rest;
    } elsif (defined $te && $te =~ /\bchunked\b/i) {
        (my $body, $left, my $err) = decode_chunked($rest);
        Test::More::fail("$name - invalid chunked body received: $err") if $err;
        $res->{body} = $body;
    } elsif (defined $cl && $cl =~ /^\d+$/) {
        warn "WARNING: $name - response body truncated: $cl expected, but got "
             . length($rest) . "\n" if length $rest < $cl;
        $res->{body} = substr $rest, 0, $cl;
        $left = substr $rest, $cl if length $rest > $cl;
    } else {
        $res->{body} = $rest;
    }
    return ($res, $left);
}

sub header {
    my ($res, $name) = @_;
    my @v = map { $_->[1] } grep { $_->[0] eq lc $name } @{ $res->{headers} };
    return @v ? join(', ', @v) : undef;
}

sub decode_chunked {
    my ($raw) = @_;
    my ($body, $p) = ('', 0);
    while (1) {
        my $eol = index $raw, "\r\n", $p;
        return ($body, undef, 'no last chunk found') if $eol < 0;
        my $line = substr $raw, $p, $eol - $p;
        return ($body, undef, "bad chunk size line \"$line\"")
            unless $line =~ /^[ \t]*([0-9a-fA-F]+)/;
        my $size = hex $1;
        $p = $eol + 2;
        if ($size == 0) {                       # trailer fields, empty line
            while (1) {
                my $e = index $raw, "\r\n", $p;
                return ($body, undef, 'no CRLF after the last chunk') if $e < 0;
                my $empty = $e == $p;
                $p = $e + 2;
                last if $empty;
            }
            return ($body, $p < length $raw ? substr($raw, $p) : undef, undef);
        }
        return ($body, undef, 'not enough octets for the data section')
            if length($raw) < $p + $size + 2;
        $body .= substr $raw, $p, $size;
        $p += $size;
        return ($body, undef, 'expected CRLF') if substr($raw, $p, 2) ne "\r\n";
        $p += 2;
    }
}

# ---------------------------------------------------------------- checks

# A section given as an array holds one value per request; with several
# requests an array is required (the real tool bails out otherwise).
sub indexed {
    my ($block, $section, $idx, $need_array) = @_;
    my $v = $block->$section;
    return $v unless defined $v;
    if (ref $v eq 'ARRAY') {
        return $v->[$need_array ? $idx : 0];
    }
    bail_out($block->name . ' - You asked for many requests, the expected'
             . ' results should be arrays as well.') if $need_array;
    return $v;
}

sub check_response {
    my ($block, $res, $idx, $rep, $arr) = @_;
    my $name = $block->name;
    my $code = $res->{code} // '';

    if (defined $block->error_code_like) {
        my $re = indexed($block, 'error_code_like', $idx, $arr);
        Test::More::like($code, qr/$re/sm, "$name - status code ok");
    } else {
        Test::More::is($code, indexed($block, 'error_code', $idx, $arr) // 200,
                       "$name - status code ok");
    }

    for my $s (qw(raw_response_headers_like raw_response_headers_unlike)) {
        my $re = indexed($block, $s, $idx, $arr);
        next unless defined $re;
        my $like = $s =~ /unlike/ ? \&Test::More::unlike : \&Test::More::like;
        $like->($res->{raw_headers}, qr/$re/s,
                "$name - raw resp headers " . ($s =~ /unlike/ ? 'unlike' : 'like'));
    }

    my $sec = defined $block->response_headers ? 'response_headers'
            : defined $block->response_headers_like ? 'response_headers_like'
            : undef;
    if ($sec) {
        for my $line (split /\n/, indexed($block, $sec, $idx, $arr) // '') {
            $line =~ s/^\s+|\s+$//g;
            next if $line eq '' || $line =~ /^#/;
            if ($line =~ s/^!\s*//) {
                Test::More::unlike($res->{raw_headers}, qr/^\s*\Q$line\E\s*:/ms,
                    "$name - header $line not present in the raw headers");
                next;
            }
            my ($key, $val) = split /\s*:\s*/, $line, 2;
            $val = server_port_subst($val // '');
            my $got = header($res, $key) // '';
            if ($sec eq 'response_headers') {
                Test::More::is($got, $val, "$name - header $key ok");
            } else {
                Test::More::like($got, qr/^$val$/, "$name - header $key like ok");
            }
        }
    }

    my $body = $res->{body};
    if (defined $block->response_body) {
        my $want = indexed($block, 'response_body', $idx, $arr);
        if (ref $want) {
            Test::More::like($body // '', $want, "$name - response_body - like (req $rep)");
        } else {
            is_long($body, server_port_subst(expand_env($want)),
                    "$name - response_body - response is expected (req $rep)");
        }
    } else {
        for my $s (qw(response_body_like response_body_unlike)) {
            my $re = indexed($block, $s, $idx, $arr);
            next unless defined $re;
            $re = server_port_subst($re) unless ref $re;
            my $f = $s =~ /unlike/ ? \&Test::More::unlike : \&Test::More::like;
            $f->($body // '', qr/$re/s, "$name - $s - response is expected (req $rep)");
        }
    }
}

sub server_port_subst {
    my ($s) = @_;
    return $s if !defined $s || ref $s;
    my $cp = $ENV{TEST_NGINX_CLIENT_PORT} || $ServerPort;
    $s =~ s/\$ServerPortForClient\b/$cp/g;
    $s =~ s/\$ServerPort\b/$ServerPort/g;
    return $s;
}

# Exact comparison: a text diff for short text, the first difference for
# long or binary bodies (so a 1 MiB mismatch doesn't flood the output).
sub is_long {
    my ($got, $want, $name) = @_;
    if (!defined $got || !defined $want
        || length($got) + length($want) < 8192 && "$got$want" !~ /[\0-\x08]/)
    {
        local $Test::Builder::Level = $Test::Builder::Level + 1;
        return Test::Base::is($got, $want, $name);
    }
    return Test::More::pass($name) if $got eq $want;
    Test::More::fail($name);
    my $n = min(length $got, length $want);
    my $x = substr($got, 0, $n) ^ substr($want, 0, $n);
    my $at = $x =~ /[^\0]/ ? $-[0] : $n;
    my $show = sub {
        (my $s = substr $_[0], $at, 40) =~ s/([^\x20-\x7e])/sprintf '\x%02x', ord $1/ge;
        return "\"$s\"...";
    };
    Test::More::diag("         got: " . $show->($got) . "\n      length: "
        . length($got) . "\n    expected: " . $show->($want) . "\n      length: "
        . length($want) . "\n    strings begin to differ at char " . ($at + 1));
}

sub read_log {
    my ($file, $pos_ref) = @_;
    open my $in, '<:raw', $file or return [];
    seek $in, $$pos_ref, 0 unless $CheckAccumErrLog;
    my @lines = <$in>;
    $$pos_ref = tell $in unless $CheckAccumErrLog;
    return \@lines;
}

sub patterns {
    my ($spec) = @_;
    return () unless defined $spec;
    return ($spec) if ref $spec eq 'Regexp';
    return grep { defined } @$spec if ref $spec eq 'ARRAY';
    chomp $spec;
    return split /\n+/, $spec;
}

sub fmt {
    (my $s = shift) =~ s/\n\z//;
    $s =~ s/"/\\"/g;
    $s =~ s/\r/\\r/g;
    $s =~ s/\n/\\n/g;
    return $s;
}

# error_log / no_error_log / grep_error_log / access_log / no_access_log
# against the part of the log not yet looked at by this block.
sub check_logs {
    my ($block, $rep) = @_;
    my $name = $block->name;
    sleep $Sleep * 3;       # log-phase lines come after the response is sent
    my $lines = read_log("$ServRoot/logs/error.log", \$ErrLogPos);

    if (defined(my $grep = $block->grep_error_log)) {
        $grep = $grep->[$rep] if ref $grep eq 'ARRAY';
        my $want = $block->grep_error_log_out;
        bail_out("$name - No --- grep_error_log_out defined but"
                 . " --- grep_error_log is defined") unless defined $want;
        $want = $want->[$rep] if ref $want eq 'ARRAY';
        my $out = '';
        for (@$lines) {
            if (ref $grep ? /$grep/ : /\Q$grep\E/) {
                $out .= "$&\n" if $& !~ /\n/;
            }
        }
        if (ref $want eq 'Regexp') {
            Test::More::like($out, $want, "$name - grep_error_log_out (req $rep)");
        } else {
            is_long($out, expand_env($want), "$name - grep_error_log_out (req $rep)");
        }
    }

    my @logs = ([error => $lines]);
    if (defined $block->access_log || defined $block->no_access_log) {
        push @logs, [access => read_log("$ServRoot/logs/access.log", \$AccLogPos)];
    }
    for my $log (@logs) {
        my ($kind, $data) = @$log;
        my ($yes, $no) = ("${kind}_log", "no_${kind}_log");
        for my $pat (patterns(scalar $block->$yes)) {
            my $hit = grep { ref $pat ? $_ =~ $pat : index($_, $pat) >= 0 } @$data;
            Test::More::ok($hit, "$name - pattern \"$pat\" "
                . ($hit ? 'matches' : 'should match') . " a line in $kind.log (req $rep)");
        }
        for my $pat (patterns(scalar $block->$no)) {
            my ($hit) = grep { ref $pat ? $_ =~ $pat : index($_, $pat) >= 0 } @$data;
            my $p = fmt($pat);
            Test::More::ok(!defined $hit, defined $hit
                ? "$name - pattern \"$p\" should not match any line in $kind.log"
                  . " but matches line \"" . fmt($hit) . "\" (req $rep)"
                : "$name - pattern \"$p\" does not match a line in $kind.log (req $rep)");
        }
    }

    my $mentioned = join "\n", map { ref eq 'ARRAY' ? @$_ : $_ }
        grep { defined } scalar $block->error_log, scalar $block->no_error_log;
    for my $level (qw(alert crit emerg)) {
        next if index($mentioned, "[$level") >= 0;
        warn "WARNING: $name - " . fmt($_) . "\n" for grep { /\[$level\]/ } @$lines;
    }
    for (grep { /\bAssertion .*?failed\b/ } @$lines) {
        (my $l = $_) =~ s/\n\z//;
        Test::More::fail("$name - $l");
    }
}

# ---------------------------------------------------------------- helpers

sub read_file {
    my ($path) = @_;
    open my $in, '<:raw', $path or return '';
    local $/;
    return scalar(<$in>) // '';
}

sub write_file {
    my ($path, $data) = @_;
    open my $out, '>:raw', $path or bail_out("Can't open $path for writing: $!");
    print $out $data;
    close $out or bail_out("Can't write $path: $!");
}

# A port on 127.0.0.1 that binds now and is none of ours.
sub free_port {
    my %taken = map { ($_ => 1) } grep { defined } $ServerPort, @_;
    for (1 .. 1000) {
        my $port = 1988 + int rand(65534 - 1988);
        next if $taken{$port};
        my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1',
                                      LocalPort => $port, Listen => 1);
        return $port if $s;
    }
    bail_out('no free port found');
}

# The real tool evaluates --- init and --- skip_eval in Test::Nginx::Util,
# where its helpers and $NginxVersion live: the same names there.
{
    no strict 'refs';       ## no critic (ProhibitNoStrict)
    *{"Test::Nginx::Util::$_"} = \&{"Test::Nginx::Socket::$_"} for @EXPORT;
    *Test::Nginx::Util::NginxVersion = \$NginxVersion;
}

1;

__END__

=head1 NAME

Test::Nginx::Socket - local subset of openresty's Test::Nginx::Socket

=head1 SYNOPSIS

    use Test::Nginx::Socket 'no_plan';
    no_shuffle();
    run_tests();
    __DATA__
    === TEST 1: name
    --- config
        location /t { return 200 "ok\n"; }
    --- request
    GET /t
    --- response_body
    ok

=head1 DESCRIPTION

Runs Test::Nginx::Socket-format test files when the real module (not packaged
in Debian) is absent; F<t/runner> is put on C<@INC> only then.  It follows the
real tool's file format, generated nginx.conf, server root layout, test names
and test counts for the sections it knows, and bails out on the real tool's
sections it does not know, so a file that passes here means the same there.

Sections: config, http_config, main_config, post_main_config, request
(string or C<eval> array), raw_request, pipelined_requests, more_headers,
error_code, error_code_like, response_body, response_body_like,
response_body_unlike, response_headers, response_headers_like,
raw_response_headers_like, raw_response_headers_unlike, error_log,
no_error_log, grep_error_log, grep_error_log_out, access_log, no_access_log,
timeout, abort, shutdown, wait, init, must_die, ignore_response, log_level,
user_files, skip_eval, skip_nginx, and Test::Base's ONLY, SKIP, LAST and filters.

Exports: run_tests no_shuffle repeat_each log_level master_on master_off
no_root_location server_root html_dir server_port worker_connections
workers env_to_nginx add_block_preprocessor bail_out timeout
check_accum_error_log no_long_string, plus Test::Base's (plan blocks is ok like ...).

Like the real tool, it checks the logs after every response of a block (each
check sees only the lines not yet seen; the first one of a block starts at
the top of error.log, startup lines included), and with several requests
every expectation section must be an array.  As there, C<--- init> and
C<--- skip_eval> code runs in package Test::Nginx::Util (not main), a skipped
block's init still runs, and C<$TEST_NGINX_RAND_PORT_N> are expanded in the
generated files only (C<$Test::Nginx::Util::RandPorts>), never put in C<%ENV>.

Differences from the real tool: nginx listens on 127.0.0.1 only; readiness is
seen in /proc/net/tcp rather than by retrying connections; nginx's stderr is
kept in logs/stderr.log (and echoed); no_error_log fails once per pattern, not
once per matching line; a timeout does not suppress the plan; a request
given as packets keeps every
packet but the first at its length, counted from the end;
TEST_NGINX_WORKER_CONNECTIONS and TEST_NGINX_VALGRIND_LOG are ours.  HUP mode,
leak checks, benchmarks, systemtap, HTTP/2 and mock TCP/UDP servers are not
implemented.

=cut
