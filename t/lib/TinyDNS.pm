package TinyDNS;

# A tiny DNS server for the tests: UDP on 127.0.0.1 at a free port, in a
# child process stopped by its pid.  It answers A queries for the names of
# a map the test changes at any time (a file the child reads on every
# query), with a short TTL; a name not in the map is NXDOMAIN; AAAA and
# other types of a known name get an empty answer.  Core Perl only.
#
#   my $dns = TinyDNS->new(dir => $dir, ttl => 1);
#   $dns->set('redis.test' => '127.0.0.2');   # undef: the name is gone
#   $dns->set('redis.test' => '127.0.0.3,127.0.0.2');   # two, in order
#   $dns->asked('redis.test');                # queries answered so far
#   "resolver 127.0.0.1:" . $dns->port . " valid=1s;"
#   $dns->stop;

use strict;
use warnings;

use IO::Socket::INET ();
use POSIX ();

sub new {
    my ($class, %opt) = @_;

    my $self = bless {
        map  => "$opt{dir}/dns.map",
        ttl  => $opt{ttl} // 1,
        names => {},
    }, $class;

    $self->write_map;

    my $sock = IO::Socket::INET->new(Proto => 'udp',
                                     LocalAddr => '127.0.0.1',
                                     LocalPort => 0)
        or die "dns: $!\n";
    $self->{port} = $sock->sockport;

    my $pid = fork();
    die "fork: $!\n" unless defined $pid;

    if ($pid == 0) {
        $SIG{TERM} = sub { POSIX::_exit(0) };
        eval { $self->serve($sock) };
        POSIX::_exit(0);
    }

    close $sock;
    $self->{pid} = $pid;

    return $self;
}

sub port { $_[0]{port} }

# the name's address from now on (undef: the name does not exist)
sub set {
    my ($self, $name, $ip) = @_;

    if (defined $ip) {
        $self->{names}{lc $name} = $ip;
    } else {
        delete $self->{names}{lc $name};
    }

    $self->write_map;
}

sub write_map {
    my ($self) = @_;
    my $tmp = "$self->{map}.tmp";

    open my $fh, '>', $tmp or die "$tmp: $!\n";
    print $fh "$_ $self->{names}{$_}\n" for sort keys %{ $self->{names} };
    close $fh;
    rename $tmp, $self->{map} or die "$self->{map}: $!\n";
}

sub read_map {
    my ($self) = @_;
    my %m;

    open my $fh, '<', $self->{map} or return \%m;
    while (<$fh>) {
        my ($n, $ip) = split;
        $m{$n} = $ip if defined $ip;
    }
    close $fh;

    return \%m;
}

sub serve {
    my ($self, $sock) = @_;

    while (1) {
        my $query = '';
        my $peer = $sock->recv($query, 512);
        next unless defined $peer && length($query) >= 12;

        my $answer = $self->answer($query);
        next unless defined $answer;
        $sock->send($answer, 0, $peer);

        # for asked(): one line per answer, the name asked
        if (open my $fh, '>>', "$self->{map}.asked") {
            print $fh lc($self->{last} // ''), "\n";
            close $fh;
        }
    }
}

sub answer {
    my ($self, $q) = @_;

    my ($id, $flags, $qd) = unpack 'n n n', $q;
    return undef if $qd != 1;

    # the question: labels, then type and class
    my ($pos, @labels) = (12);
    while (1) {
        return undef if $pos >= length $q;
        my $len = ord substr($q, $pos, 1);
        $pos++;
        last if $len == 0;
        return undef if $len > 63;
        push @labels, substr($q, $pos, $len);
        $pos += $len;
    }
    return undef if $pos + 4 > length $q;

    my ($type, $class) = unpack 'n n', substr($q, $pos, 4);
    my $question = substr($q, 12, $pos + 4 - 12);
    my $name = lc join '.', @labels;
    $self->{last} = $name;

    my $ip = $self->read_map->{$name};
    my $rd = $flags & 0x0100;
    my $rcode = defined $ip ? 0 : 3;    # NXDOMAIN
    my @answers;

    if (defined $ip && $type == 1 && $class == 1) {
        # a pointer to the question's name, A, IN, TTL, 4 bytes; each
        # address of a list, in its order
        push @answers, pack('n n n N n', 0xc00c, 1, 1, $self->{ttl}, 4)
                       . pack('C4', split /\./, $_)
            for split /,/, $ip;
    }

    return pack('n n n n n n', $id, 0x8000 | 0x0080 | $rd | $rcode, 1,
                scalar @answers, 0, 0)
           . $question . join('', @answers);
}

# how many queries for $name the server answered so far
sub asked {
    my ($self, $name) = @_;
    my $n = 0;

    open my $fh, '<', "$self->{map}.asked" or return 0;
    while (<$fh>) {
        chomp;
        $n++ if $_ eq lc $name;
    }
    close $fh;

    return $n;
}

sub stop {
    my ($self) = @_;
    my $pid = delete $self->{pid} or return;

    kill 'TERM', $pid;
    waitpid($pid, 0);
}

sub DESTROY { $_[0]->stop }

1;
