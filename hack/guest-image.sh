#!/usr/bin/env bash
# Builds the Debian guest image the kvm end-to-end test boots: a UEFI qcow2
# that is to the test what a distribution's cloud image is to a user, and
# nothing more. Debian 12 from packages (mmdebstrap), the cloud kernel,
# systemd-boot on an EFI system partition, cloud-init with the NoCloud
# datasource, DHCP on the first NIC through systemd-networkd, and Squid
# installed. No test keys, logins or configuration: the guest learns
# everything from its NoCloud seed, as a user's guest would.
#
# Usage: hack/guest-image.sh OUT.qcow2
# The image is cached beside OUT as OUT's name with the sha256 of this
# script in it; OUT is a symlink to the cached file, so a run with an
# unchanged recipe costs nothing.
set -euo pipefail

out=${1:?usage: hack/guest-image.sh OUT.qcow2}
recipe=$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-16)
cached="${out%.qcow2}-$recipe.qcow2"
if [ -s "$cached" ]; then
	ln -sfn "$(basename "$cached")" "$out"
	exit 0
fi
for tool in mmdebstrap sfdisk mkfs.ext4 mkfs.vfat mcopy qemu-img; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "guest-image: $tool is missing (hack/install-deps.sh installs mmdebstrap fdisk e2fsprogs dosfstools mtools qemu-utils)" >&2
		exit 1
	fi
done
if [ "$(id -u)" != 0 ]; then
	echo "guest-image: mmdebstrap needs root here (it chroots into the new tree)" >&2
	exit 1
fi

mirror=${GUEST_IMAGE_MIRROR:-http://deb.debian.org/debian}
work=$(mktemp -d "${TMPDIR:-/tmp}/pf-guest-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
root="$work/root"
start=$SECONDS

# The package set is what a cloud image needs to boot and run Squid, without
# recommends (mmdebstrap's default), so a guest boots quickly even under
# software emulation: systemd, the cloud kernel and systemd-boot's EFI
# binary, cloud-init (and growpart, which grows the root partition to the
# overlay's size), iproute2 for systemd-networkd's renderer,
# systemd-resolved for the name servers DHCP hands out (Squid reads
# /etc/resolv.conf, which points at its stub), squid.
packages=systemd-sysv,udev,netbase,iproute2,systemd-resolved,e2fsprogs,linux-image-cloud-amd64,systemd-boot-efi,cloud-init,cloud-guest-utils,squid
mmdebstrap --variant=apt --include="$packages" \
	--dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
	--dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
	--dpkgopt='path-exclude=/usr/share/info/*' \
	--customize-hook='echo "LABEL=root / ext4 defaults,errors=remount-ro 0 1" > "$1/etc/fstab"' \
	--customize-hook='rm -f "$1/etc/hostname"; : > "$1/etc/machine-id"' \
	--customize-hook='ln -sfn ../run/systemd/resolve/stub-resolv.conf "$1/etc/resolv.conf"' \
	--customize-hook='printf "datasource_list: [NoCloud, None]\n" > "$1/etc/cloud/cloud.cfg.d/90-datasource.cfg"' \
	--customize-hook='chroot "$1" systemctl enable systemd-networkd.service systemd-resolved.service' \
	--customize-hook='printf "deb http://deb.debian.org/debian bookworm main\ndeb http://deb.debian.org/debian-security bookworm-security main\n" > "$1/etc/apt/sources.list"' \
	--customize-hook='rm -rf "$1/var/cache/apt/"*.bin "$1/var/log/"*.log' \
	bookworm "$root" "$mirror"

# The EFI system partition holds the boot loader, its one entry, and the
# kernel and initramfs it loads (systemd-boot reads only its own partition).
kernel=$(ls "$root"/boot/vmlinuz-* | sort -V | tail -1)
initrd=$(ls "$root"/boot/initrd.img-* | sort -V | tail -1)
esp="$work/esp.img"
truncate -s 128M "$esp"
mkfs.vfat -F 32 -n ESP "$esp" >/dev/null
mkdir -p "$work/espfs/EFI/BOOT" "$work/espfs/loader/entries"
cp "$root/usr/lib/systemd/boot/efi/systemd-bootx64.efi" "$work/espfs/EFI/BOOT/BOOTX64.EFI"
cp "$kernel" "$work/espfs/vmlinuz"
cp "$initrd" "$work/espfs/initrd.img"
printf 'default debian.conf\ntimeout 0\n' > "$work/espfs/loader/loader.conf"
printf 'title Debian\nlinux /vmlinuz\ninitrd /initrd.img\noptions root=LABEL=root ro console=tty0 console=ttyS0,115200 net.ifnames=1\n' \
	> "$work/espfs/loader/entries/debian.conf"
mcopy -s -i "$esp" "$work/espfs/"* ::/

# The disk: an MBR with the ESP first and the root file system last, so
# cloud-init's growpart can grow it to whatever size the overlay has. The
# file systems are made from directories (mkfs.ext4 -d, mtools), so no loop
# device or mount is needed.
disk="$work/disk.raw"
truncate -s 2G "$disk"
printf 'label: dos\nstart=1MiB, size=128MiB, type=ef\nstart=129MiB, type=83\n' | sfdisk -q "$disk"
rootsize=$(( (2048 - 129) * 1024 * 1024 ))
truncate -s "$rootsize" "$work/root.img"
mkfs.ext4 -q -L root -d "$root" "$work/root.img"
dd if="$esp" of="$disk" bs=1M seek=1 conv=notrunc,sparse status=none
dd if="$work/root.img" of="$disk" bs=1M seek=129 conv=notrunc,sparse status=none
mkdir -p "$(dirname "$out")"
qemu-img convert -q -c -f raw -O qcow2 "$disk" "$cached.tmp"
mv "$cached.tmp" "$cached"
# Images of earlier recipes are never used again.
for old in "${out%.qcow2}"-*.qcow2; do [ "$old" = "$cached" ] || rm -f "$old"; done
ln -sfn "$(basename "$cached")" "$out"
echo "guest-image: $cached ($(du -h "$cached" | cut -f1)) in $((SECONDS - start)) s"
