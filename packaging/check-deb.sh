#!/bin/sh
# Builds the Debian package from a build tree with CPack and checks it with dpkg-deb: its name,
# fields, contents and modes; the units and example it ships; a stripped binary that runs; the
# maintainer scripts (run against a DPKG_ROOT, with systemctl recording what it is asked).
#   check-deb.sh BUILD_DIR VERSION
set -eu
build=$1
version=$2
src=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "check-deb: $*" >&2
  exit 1
}

cpack -G DEB --config "$build/CPackConfig.cmake" -B "$tmp/out" >"$tmp/cpack.log" 2>&1 ||
  fail "cpack failed: $(cat "$tmp/cpack.log")"
arch=$(dpkg --print-architecture)
deb=$tmp/out/bcd_${version}_${arch}.deb
[ -f "$deb" ] || fail "no $deb; cpack wrote: $(ls "$tmp/out")"
echo "built $(basename "$deb") ($(du -k "$deb" | cut -f1) KiB)"

[ "$(dpkg-deb --field "$deb" Package)" = bcd ] || fail "Package is not bcd"
[ "$(dpkg-deb --field "$deb" Version)" = "$version" ] || fail "Version is not $version"
[ "$(dpkg-deb --field "$deb" Architecture)" = "$arch" ] || fail "Architecture is not $arch"
depends=$(dpkg-deb --field "$deb" Depends)
for library in libc6 libssl3 libgrpc++; do
  case $depends in
    *"$library"*) ;;
    *) fail "Depends does not name $library: \"$depends\"" ;;
  esac
done

dpkg-deb --contents "$deb" >"$tmp/contents"
# mode path, for what must be there.
while read -r mode path; do
  grep -E "^$mode [^ ]+ +[0-9]+ [0-9-]+ [0-9:]+ \\.$path( |$)" "$tmp/contents" >/dev/null ||
    fail "$path is not in the package with mode $mode: $(cat "$tmp/contents")"
done <<'LIST'
-rwxr-xr-x /usr/bin/bcd
-rw-r--r-- /usr/lib/systemd/system/bcd-node.service
-rw-r--r-- /usr/lib/systemd/system/bcd-site.service
-rw-r--r-- /usr/share/doc/bcd/examples/config.toml
-rw-r--r-- /usr/share/doc/bcd/ramdisk/bcd-ramdisk.service
-rw-r--r-- /usr/share/doc/bcd/ramdisk/README.md
drwx------ /var/lib/bcd/
LIST
if grep -E '\./etc/' "$tmp/contents" >/dev/null; then
  fail "the package ships files under /etc (a config would start the service): $(grep -E '\./etc/' "$tmp/contents")"
fi
grep -E ' root/root ' "$tmp/contents" >/dev/null || fail "files are not owned by root"
if grep -v ' root/root ' "$tmp/contents" >/dev/null; then fail "a file is not root/root"; fi

dpkg-deb --extract "$deb" "$tmp/x"
for unit in bcd-node.service bcd-site.service; do
  cmp "$src/$unit" "$tmp/x/usr/lib/systemd/system/$unit" || fail "$unit differs from packaging/"
done
if readelf -S "$tmp/x/usr/bin/bcd" | grep -q '\.debug_info'; then fail "the binary is not stripped"; fi
"$tmp/x/usr/bin/bcd" version | grep -q "^bcd $version\$" || fail "the packaged bcd does not run"
"$tmp/x/usr/bin/bcd" version --config "$tmp/x/usr/share/doc/bcd/examples/config.toml" >/dev/null ||
  fail "the example config does not parse"
echo "binary: $(du -k "$tmp/x/usr/bin/bcd" | cut -f1) KiB stripped"

# The maintainer scripts, with a systemctl that records its calls first in PATH.
dpkg-deb --control "$deb" "$tmp/control"
for script in postinst prerm postrm; do
  [ -x "$tmp/control/$script" ] || fail "no executable $script"
  cmp "$src/deb/$script" "$tmp/control/$script" || fail "$script differs from packaging/deb/"
done
mkdir -p "$tmp/bin" "$tmp/root"
printf '#!/bin/sh\necho "$*" >>%s/systemctl.calls\n' "$tmp" >"$tmp/bin/systemctl"
chmod 0755 "$tmp/bin/systemctl"
PATH=$tmp/bin:$PATH DPKG_ROOT=$tmp/root sh "$tmp/control/postinst" configure
for dir in var/lib/bcd etc/bcd; do
  [ "$(stat -c %a "$tmp/root/$dir")" = 700 ] || fail "postinst left /$dir $(stat -c %a "$tmp/root/$dir")"
done
[ ! -e "$tmp/systemctl.calls" ] || fail "postinst ran systemctl: $(cat "$tmp/systemctl.calls")"
[ ! -e "$tmp/root/etc/bcd/config.toml" ] || fail "postinst wrote a config"
# As on a machine running systemd: a fresh install only reloads, an upgrade restarts what runs;
# neither enables nor starts a unit.
mkdir -p "$tmp/run-systemd"
sed "s|\[ -z \"\$root\" \] && \[ -d /run/systemd/system \]|[ -d $tmp/run-systemd ]|" \
  "$tmp/control/postinst" >"$tmp/postinst.systemd"
grep -q "run-systemd" "$tmp/postinst.systemd" || fail "postinst no longer tests for systemd as expected"
PATH=$tmp/bin:$PATH DPKG_ROOT=$tmp/root sh "$tmp/postinst.systemd" configure
[ "$(cat "$tmp/systemctl.calls")" = daemon-reload ] ||
  fail "a fresh install ran: $(cat "$tmp/systemctl.calls")"
rm "$tmp/systemctl.calls"
PATH=$tmp/bin:$PATH DPKG_ROOT=$tmp/root sh "$tmp/postinst.systemd" configure 0.0.9
[ "$(cat "$tmp/systemctl.calls")" = "daemon-reload
try-restart bcd-node.service bcd-site.service" ] || fail "an upgrade ran: $(cat "$tmp/systemctl.calls")"
rm "$tmp/systemctl.calls"
PATH=$tmp/bin:$PATH DPKG_ROOT=$tmp/root sh "$tmp/control/postrm" purge
[ ! -e "$tmp/root/var/lib/bcd" ] || fail "purge left /var/lib/bcd"
echo "package ok"
