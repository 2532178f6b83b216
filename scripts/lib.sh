# Shared by scripts/demo and scripts/test: install what is missing, configure and build.
# Sourced, not run.

set -euo pipefail

BCD_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BCD_JOBS=${BCD_JOBS:-2}
# CI builds a fresh clone in a new folder each time: let ccache ignore where the tree is.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$BCD_ROOT}
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}  # gRPC-heavy translation units take 1-2 GB each; more jobs swap on 2 cores

# Debian 12 packages the build and the tests need.
BCD_PACKAGES=(
  cmake ninja-build ccache pkg-config g++ clang libclang-rt-dev clang-format clang-tidy
  protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libgrpc++-dev libabsl-dev
  libssl-dev libboost-dev zlib1g-dev libtomlplusplus-dev libfmt-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev openssl
  tinyproxy  # a real HTTP CONNECT proxy for the WebSocket transport's tests
  openssh-server openssh-client  # ssh -L beside the tunnel benchmark
  shellcheck curl wget binutils  # the generated installer: linted, and run downloading with curl and wget
  systemd dpkg-dev  # systemd-analyze verify on the units; dpkg-shlibdeps and dpkg-deb for the package
  strace  # the durability tests watch bcd's system calls
  util-linux  # unshare: the tunnel-user test gives bcd its own /etc/passwd
  prometheus jq  # promtool lints /metrics; jq reads bcd status --json
  help2man lintian man-db  # the manual pages made from --help, the package's lint, man -l
  python3 openipmi ipmitool  # the Redfish BMC emulator; ipmi_sim, a real IPMI BMC, and its client
  python3-sushy redfishtool  # Redfish clients nobody here wrote, to check the emulator against
  nginx  # a file server for boot images, and the boot server's side-by-side figures
  qemu-system-x86 ipxe-qemu  # a machine that PXE-boots from the boot server (its NIC's iPXE ROM)
  linux-image-cloud-amd64 busybox-static cpio  # what that machine boots: a kernel, a tiny ramdisk
)
# Commands the tests need, and the Debian package of each when the command is missing (Node.js may
# come from elsewhere, with its own npm: a machine that has both keeps them).
BCD_COMMANDS=(node:nodejs npm:npm)

log() { printf '\n==> %s\n' "$*" >&2; }

install_missing_packages() {
  local missing=()
  for pkg in "${BCD_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  for pair in "${BCD_COMMANDS[@]}"; do
    command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing ${missing[*]}"
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "run as root, or install: ${missing[*]}" >&2; exit 1; }
    sudo=(sudo)
  fi
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# The independent peers of the interop tests (jose), pinned by tests/interop/package-lock.json.
# Node.js and npm are installed above; without them the interop tests fail, they are never
# silently left out.
install_node_peers() {
  if ! command -v npm >/dev/null; then
    echo "npm is not installed: the interop tests need Node.js and npm" >&2
    exit 1
  fi
  log "installing the interop peers (npm ci)"
  npm ci --prefix "$BCD_ROOT/tests/interop" --no-audit --no-fund --loglevel=error
}

# configure DIR [cmake -D args...]
configure() {
  local dir=$1
  shift
  cmake -S "$BCD_ROOT" -B "$BCD_ROOT/$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
}

# build DIR [targets...]
build() {
  local dir=$1
  shift
  log "building $dir"
  local targets=()
  for t in "$@"; do targets+=(--target "$t"); done
  cmake --build "$BCD_ROOT/$dir" -j "$BCD_JOBS" "${targets[@]}"
}
