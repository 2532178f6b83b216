#!/bin/sh
# Builds the Debian package from a build tree with CPack and checks it with dpkg-deb: its name,
# fields, contents and modes; the units and example it ships; a stripped binary that runs; the
# maintainer scripts (run against a DPKG_ROOT, with systemctl recording what it is asked).
#   check-deb.sh BUILD_DIR VERSION
# As root, it also installs, reinstalls, removes and purges the package with the real dpkg, in a
# private mount namespace whose /etc, /usr, /var and /run are overlays (nothing reaches the system).
set -eu

# Inside that namespace (check-deb.sh --inside TMP DEB): every step's effect, or exit 1 saying what.
if [ "${1:-}" = --inside ]; then
  tmp=$2
  deb=$3
  for dir in /etc /usr /var /run; do
    name=$(echo "$dir" | tr / _)
    mkdir -p "$tmp/ov/$name/upper" "$tmp/ov/$name/work"
    mount -t overlay overlay \
      -o "lowerdir=$dir,upperdir=$tmp/ov/$name/upper,workdir=$tmp/ov/$name/work" "$dir"
  done
  mkdir -p /run/systemd/system # as if systemd ran: the scripts talk to (our recording) systemctl
  PATH=$tmp/bin:$PATH
  export PATH
  calls() {
    cat "$tmp/systemctl.calls" 2>/dev/null || true
    rm -f "$tmp/systemctl.calls"
  }
  no() {
    echo "check-deb: with dpkg: $*" >&2
    exit 1
  }
  dpkg -i "$deb" >"$tmp/dpkg.log" 2>&1 || no "dpkg -i failed: $(cat "$tmp/dpkg.log")"
  [ "$(calls)" = daemon-reload ] || no "a fresh install did more than daemon-reload"
  [ "$(stat -c %a /var/lib/bcd)" = 700 ] || no "/var/lib/bcd is $(stat -c %a /var/lib/bcd)"
  [ "$(stat -c %a /etc/bcd)" = 700 ] || no "/etc/bcd is $(stat -c %a /etc/bcd)"
  [ ! -e /etc/bcd/config.toml ] || no "the install wrote a config"
  /usr/bin/bcd version >/dev/null || no "the installed /usr/bin/bcd does not run"
  [ -f /usr/lib/systemd/system/bcd-node.service ] || no "no bcd-node.service"
  dpkg -i "$deb" >"$tmp/dpkg.log" 2>&1 || no "dpkg -i again failed: $(cat "$tmp/dpkg.log")"
  [ "$(calls)" = "daemon-reload
try-restart bcd-node.service bcd-site.service" ] || no "an upgrade did not just reload and try-restart"
  echo identity >/var/lib/bcd/identity.pem
  dpkg -r bcd >"$tmp/dpkg.log" 2>&1 || no "dpkg -r failed: $(cat "$tmp/dpkg.log")"
  [ "$(calls)" = "stop bcd-node.service bcd-site.service
daemon-reload" ] || no "a removal did not stop the units and reload"
  [ ! -e /usr/bin/bcd ] || no "dpkg -r left /usr/bin/bcd"
  [ -f /var/lib/bcd/identity.pem ] || no "dpkg -r removed the identity (only a purge may)"
  dpkg -P bcd >"$tmp/dpkg.log" 2>&1 || no "dpkg -P failed: $(cat "$tmp/dpkg.log")"
  if [ -e /var/lib/bcd ] || [ -e /etc/bcd ]; then no "dpkg -P left /var/lib/bcd or /etc/bcd"; fi
  exit 0
fi
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

if [ "$(id -u)" = 0 ] && unshare --mount --propagation private true 2>/dev/null; then
  unshare --mount --propagation private sh "$0" --inside "$tmp" "$deb" ||
    fail "installing, removing and purging with dpkg failed (above)"
  echo "dpkg -i, -i again, -r and -P: ok"
else
  echo "not root (or no mount namespaces): the real dpkg install is not checked"
fi
echo "package ok"
