#!/usr/bin/perl
# The backend of t/150-roads.t as a CGI script, run by fcgiwrap for the
# fastcgi_pass road: the same responses and execution log as the HTTP and
# SCGI backend of t/lib/Roads.pm.
use strict;
use warnings;
use FindBin ();
use lib $FindBin::RealBin;
use Roads ();

binmode STDOUT;
$| = 1;
Roads::cgi_main();
