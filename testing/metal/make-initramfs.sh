#!/bin/sh
# Builds the tiny ramdisk the boot test's VM runs: busybox-static, the virtio network drivers of
# the kernel it boots with, and an init that prints the kernel command line it was given, exchanges
# the discovery token on it for an assertion at the boot server (POST /discovery) and prints the
# answer, then powers the VM off. Usage: make-initramfs.sh OUT.cpio.gz KERNEL_VERSION
set -eu
out=$1
version=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin" "$work/proc" "$work/sys" "$work/dev" "$work/modules"
cp /bin/busybox "$work/bin/busybox"
for module in virtio_ring virtio failover net_failover virtio_net virtio_pci_modern_dev \
  virtio_pci_legacy_dev virtio_pci; do
  path=$(modinfo -k "$version" -n "$module")
  cp "$path" "$work/modules/$module.ko"
done
cat > "$work/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
echo "bcd-test: cmdline: $(cat /proc/cmdline)"
for m in virtio_ring virtio failover net_failover virtio_pci_modern_dev virtio_pci_legacy_dev \
  virtio_pci virtio_net; do
  insmod /modules/$m.ko 2>/dev/null
done
arg() { for word in $(cat /proc/cmdline); do case "$word" in "$1="*) echo "${word#*=}";; esac; done; }
boot=$(arg bcd.boot)
mac=$(arg bcd.mac)
token=$(arg bcd.token)
ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
nonce=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
body="{\"token\":\"$token\",\"mac\":\"$mac\",\"nonce\":\"$nonce\"}"
answer=$(wget -q -O - --header 'Content-Type: application/json' --post-data "$body" "$boot/discovery" 2>&1)
echo "bcd-test: assertion: $answer"
echo "bcd-test: done"
poweroff -f
INIT
chmod 755 "$work/init"
(cd "$work" && find . | cpio -o -H newc --quiet | gzip -1) > "$out"
