# Release hygiene: the version is written once, in
# src/ngx_http_idempotency_version.h, and everything that names a version
# says the same (debian/changelog, which names the .deb; CHANGELOG.md);
# the licence is BSD-2-Clause.

use strict;
use warnings;

use Test::More;

sub slurp {
    open my $h, '<', $_[0] or die "$_[0]: $!\n";
    local $/;
    return <$h>;
}

my ($version) = slurp('src/ngx_http_idempotency_version.h')
    =~ /^#define NGX_HTTP_IDEMPOTENCY_VERSION\s+"([^"]*)"$/m;
like($version // '', qr/^\d+\.\d+\.\d+$/,
     'src/ngx_http_idempotency_version.h has a MAJOR.MINOR.PATCH version');

my ($deb) = slurp('debian/changelog')
    =~ /\Alibnginx-mod-http-idempotency \(([^)]+)\) /;
is($deb, $version, 'debian/changelog\'s top entry is that version');

like(slurp('CHANGELOG.md'), qr/^## \[\Q$version\E\] - \d{4}-\d\d-\d\d$/m,
     'CHANGELOG.md has a section for it');

my $license = slurp('LICENSE');
like($license, qr/^BSD 2-Clause License$/m, 'LICENSE is BSD-2-Clause');
like($license,
     qr/^Copyright \(C\) \d{4} the ngx_http_idempotency_module authors$/m,
     'held by the ngx_http_idempotency_module authors');
like(slurp('debian/copyright'), qr/^License: BSD-2-Clause$/m,
     'debian/copyright says the same');

done_testing();
