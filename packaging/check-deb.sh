#!/bin/sh
# Builds the Debian package from a build tree with CPack and checks it with dpkg-deb: its name,
# fields, contents and modes; the units and example it ships; a stripped binary that runs; the
# manual pages (man -l); the changelog's version; lintian, which must have no error or warning; the
# maintainer scripts (run against a DPKG_ROOT, with systemctl, deb-systemd-helper and
# deb-systemd-invoke recording what they are asked).
#   check-deb.sh BUILD_DIR VERSION
# As root, it also installs, reinstalls, removes and purges the package with the real dpkg, in a
# private mount namespace whose /etc, /usr, /var and /run are overlays (nothing reaches the system).
set -eu

# What the maintainer scripts ask of systemd, step by step, as the recording tools write it.
fresh="deb-systemd-helper unmask bcd-node.service
deb-systemd-helper update-state bcd-node.service
deb-systemd-helper unmask bcd-site.service
deb-systemd-helper update-state bcd-site.service
systemctl --system daemon-reload"
upgrade="$fresh
deb-systemd-invoke try-restart bcd-node.service bcd-site.service"
removal="deb-systemd-invoke stop bcd-node.service bcd-site.service
systemctl --system daemon-reload
deb-systemd-helper mask bcd-node.service
deb-systemd-helper mask bcd-site.service"
purge="systemctl --system daemon-reload
deb-systemd-helper purge bcd-node.service
deb-systemd-helper unmask bcd-node.service
deb-systemd-helper purge bcd-site.service
deb-systemd-helper unmask bcd-site.service"

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
  [ "$(calls)" = "$fresh" ] || no "a fresh install did more than record the units and reload"
  [ "$(stat -c %a /var/lib/bcd)" = 700 ] || no "/var/lib/bcd is $(stat -c %a /var/lib/bcd)"
  [ "$(stat -c %a /etc/bcd)" = 700 ] || no "/etc/bcd is $(stat -c %a /etc/bcd)"
  [ ! -e /etc/bcd/config.toml ] || no "the install wrote a config"
  /usr/bin/bcd version >/dev/null || no "the installed /usr/bin/bcd does not run"
  [ -f /usr/lib/systemd/system/bcd-node.service ] || no "no bcd-node.service"
  dpkg -i "$deb" >"$tmp/dpkg.log" 2>&1 || no "dpkg -i again failed: $(cat "$tmp/dpkg.log")"
  [ "$(calls)" = "$upgrade" ] || no "an upgrade did not just reload and try-restart"
  echo identity >/var/lib/bcd/identity.pem
  dpkg -r bcd >"$tmp/dpkg.log" 2>&1 || no "dpkg -r failed: $(cat "$tmp/dpkg.log")"
  [ "$(calls)" = "$removal" ] || no "a removal did not stop, reload and mask the units"
  [ ! -e /usr/bin/bcd ] || no "dpkg -r left /usr/bin/bcd"
  [ -f /var/lib/bcd/identity.pem ] || no "dpkg -r removed the identity (only a purge may)"
  dpkg -P bcd >"$tmp/dpkg.log" 2>&1 || no "dpkg -P failed: $(cat "$tmp/dpkg.log")"
  [ "$(calls)" = "$purge" ] || no "a purge did not reload and forget the units"
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
-rw-r--r-- /usr/share/doc/bcd/changelog.gz
-rw-r--r-- /usr/share/doc/bcd/copyright
-rw-r--r-- /usr/share/doc/bcd/operations.md.gz
-rw-r--r-- /usr/share/man/man8/bcd.8.gz
-rw-r--r-- /usr/share/bash-completion/completions/bcd
-rw-r--r-- /usr/share/lintian/overrides/bcd
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
# The changelog's newest entry is this version: a version bump must say what changed.
top=$(zcat "$tmp/x/usr/share/doc/bcd/changelog.gz" | head -1)
[ "$top" = "bcd ($version) unstable; urgency=medium" ] || fail "the changelog starts \"$top\", not $version"
# The manual pages render without a warning from man, and say what they must.
for page in "$tmp/x/usr/share/man/man8/bcd.8.gz" "$build/packaging/bcd-dev.1"; do
  [ -f "$page" ] || fail "no manual page $page"
  warnings=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -l "$page" 2>&1 >/dev/null)
  [ -z "$warnings" ] || fail "man warns about $(basename "$page"): $warnings"
  text=$(LC_ALL=C.UTF-8 MANWIDTH=80 man -l "$page" 2>/dev/null)
  for section in NAME SYNOPSIS DESCRIPTION "EXIT STATUS" FILES "SEE ALSO"; do
    echo "$text" | grep -q "^$section" || fail "$(basename "$page") has no $section section"
  done
done
LC_ALL=C.UTF-8 man -l "$tmp/x/usr/share/man/man8/bcd.8.gz" 2>/dev/null | grep -q "install-script" ||
  fail "bcd(8) does not list the commands of bcd --help"
# lintian: no error and no warning (its informational tags are shown, not failed on).
lintian --allow-root --display-info "$deb" >"$tmp/lintian.log" 2>&1 || true
if grep -E '^[EW]: ' "$tmp/lintian.log" >/dev/null; then fail "lintian: $(cat "$tmp/lintian.log")"; fi
grep -E '^[IP]: ' "$tmp/lintian.log" || true
echo "lintian: no error or warning"

# The maintainer scripts, with a systemctl, deb-systemd-helper and deb-systemd-invoke that record
# their calls first in PATH.
dpkg-deb --control "$deb" "$tmp/control"
for script in postinst prerm postrm; do
  [ -x "$tmp/control/$script" ] || fail "no executable $script"
  cmp "$src/deb/$script" "$tmp/control/$script" || fail "$script differs from packaging/deb/"
done
mkdir -p "$tmp/bin" "$tmp/root"
for tool in systemctl deb-systemd-helper deb-systemd-invoke; do
  printf '#!/bin/sh\necho "%s $*" >>%s/systemctl.calls\n' "$tool" "$tmp" >"$tmp/bin/$tool"
  chmod 0755 "$tmp/bin/$tool"
done
calls() {
  cat "$tmp/systemctl.calls" 2>/dev/null || true
  rm -f "$tmp/systemctl.calls"
}
PATH=$tmp/bin:$PATH DPKG_ROOT=$tmp/root sh "$tmp/control/postinst" configure
for dir in var/lib/bcd etc/bcd; do
  [ "$(stat -c %a "$tmp/root/$dir")" = 700 ] || fail "postinst left /$dir $(stat -c %a "$tmp/root/$dir")"
done
[ -z "$(calls)" ] || fail "postinst in a DPKG_ROOT asked systemd for something"
[ ! -e "$tmp/root/etc/bcd/config.toml" ] || fail "postinst wrote a config"
# As on a machine running systemd: a fresh install only records the units and reloads, an upgrade
# restarts what runs; neither enables nor starts a unit; removal and purge undo it.
mkdir -p "$tmp/run-systemd"
for script in postinst prerm postrm; do
  sed -e "s|\[ -z \"\$root\" \] && \[ -d /run/systemd/system \]|[ -d $tmp/run-systemd ]|" \
    -e "s|\[ -z \"\${DPKG_ROOT:-}\" \] && \[ -d /run/systemd/system \]|[ -d $tmp/run-systemd ]|" \
    -e "s|\[ -z \"\$root\" \] && command -v|command -v|" \
    "$tmp/control/$script" >"$tmp/$script.systemd"
  grep -q "run-systemd" "$tmp/$script.systemd" || fail "$script no longer tests for systemd as expected"
done
PATH=$tmp/bin:$PATH DPKG_ROOT=$tmp/root sh "$tmp/postinst.systemd" configure
[ "$(calls)" = "$fresh" ] || fail "a fresh install ran something else"
PATH=$tmp/bin:$PATH DPKG_ROOT=$tmp/root sh "$tmp/postinst.systemd" configure 0.0.9
[ "$(calls)" = "$upgrade" ] || fail "an upgrade ran something else"
PATH=$tmp/bin:$PATH DPKG_ROOT=$tmp/root sh "$tmp/prerm.systemd" remove
mkdir -p "$tmp/root/usr/bin"
touch "$tmp/root/usr/bin/bcd.previous" "$tmp/root/usr/bin/.bcd.download"
PATH=$tmp/bin:$PATH DPKG_ROOT=$tmp/root sh "$tmp/postrm.systemd" remove
[ "$(calls)" = "$removal" ] || fail "a removal ran something else"
[ ! -e "$tmp/root/usr/bin/bcd.previous" ] && [ ! -e "$tmp/root/usr/bin/.bcd.download" ] ||
  fail "a removal left what daemon.upgrade put beside the binary"
PATH=$tmp/bin:$PATH DPKG_ROOT=$tmp/root sh "$tmp/postrm.systemd" purge
[ "$(calls)" = "$purge" ] || fail "a purge ran something else"
[ ! -e "$tmp/root/var/lib/bcd" ] || fail "purge left /var/lib/bcd"

if [ "$(id -u)" = 0 ] && unshare --mount --propagation private true 2>/dev/null; then
  unshare --mount --propagation private sh "$0" --inside "$tmp" "$deb" ||
    fail "installing, removing and purging with dpkg failed (above)"
  echo "dpkg -i, -i again, -r and -P: ok"
else
  echo "not root (or no mount namespaces): the real dpkg install is not checked"
fi
echo "package ok"
