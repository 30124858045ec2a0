#!/bin/sh
# PID 1 of one lab host: `unshare --mount --uts --pid --fork --kill-child --mount-proc` runs this
# script in fresh mount, UTS and PID namespaces. It gives the host a writable, throw-away view of
# the system directories, makes everything else read-only, and execs a real sshd.
#
#   host-init.sh NAME ADDRESS PORT HOST_DIR
#
# HOST_DIR (prepared by `fxkit lab up`) holds ssh_host_ed25519_key[.pub], authorized_keys,
# optionally `sudo-user` (NAME:PASSWORD-HASH of a non-root user allowed to sudo with a password),
# and an empty `rt/` on which the host's state tmpfs is mounted. sshd logs to stderr (the host's
# log file). When sshd (PID 1) exits, the kernel removes the namespaces and all their mounts.
set -eu
name=$1 address=$2 port=$3 hostdir=$4
rt=$hostdir/rt

# Writable state lives in memory and goes away with the host. The script works inside it (relative
# paths) because the mounts below may cover HOST_DIR itself.
mount -t tmpfs -o mode=0700 fxkit-lab "$rt"
cd "$rt"
mkdir in
cp "$hostdir"/ssh_host_ed25519_key* "$hostdir"/authorized_keys in/
[ ! -e "$hostdir/sudo-user" ] || cp "$hostdir/sudo-user" in/
for dir in /etc /var /opt /srv /usr; do
    mkdir -p "upper$dir" "work$dir"
    mount -t overlay fxkit-lab -o "lowerdir=$dir,upperdir=upper$dir,workdir=work$dir" "$dir"
done
# Clean homes: the real machine's users' files are not the lab's business.
mount -t tmpfs -o mode=0700 fxkit-lab /root
mount -t tmpfs -o mode=0755 fxkit-lab /home
mount -t tmpfs -o mode=0755 fxkit-lab /run
mount -t tmpfs -o mode=1777 fxkit-lab /tmp
mount -t tmpfs -o mode=1777,nosuid,nodev fxkit-lab /dev/shm

# Everything not overlaid above becomes read-only in this namespace (a bind remount changes this
# mount only, never the real file system), so nothing can leak to the real machine. /proc/sys is
# read-only too: a host cannot change the real kernel's settings.
mount --bind /proc/sys /proc/sys
[ ! -e /proc/sysrq-trigger ] || mount --bind /proc/sysrq-trigger /proc/sysrq-trigger
findmnt -rn -o TARGET,VFS-OPTIONS | while read -r target options; do
    case "$target" in
        /etc | /var | /opt | /srv | /usr | /root | /home | /run | /tmp) continue ;;
        /etc/* | /var/* | /opt/* | /srv/* | /usr/* | /root/* | /home/* | /run/* | /tmp/*) continue ;;
        /dev/shm | /dev/pts | /proc) continue ;;
    esac
    case ",$options," in *,ro,*) continue ;; esac
    # Keep the mount's other flags (nosuid, noexec...) but not "rw" (always first), which would
    # undo "ro".
    flags=${options#rw}
    mount -o "remount,bind,ro$flags" "$target" || {
        echo "host-init: cannot make $target read-only; refusing to start a host that could write to it" >&2
        exit 1
    }
done

hostname "$name"
echo "$name" > /etc/hostname
printf '127.0.0.1\tlocalhost\n%s\t%s\n' "$address" "$name" > /etc/hosts

# The real machine's host keys must not be readable inside a lab host.
rm -f /etc/ssh/ssh_host_*
install -m 0600 in/ssh_host_ed25519_key /etc/ssh/ssh_host_ed25519_key
install -m 0644 in/ssh_host_ed25519_key.pub /etc/ssh/ssh_host_ed25519_key.pub
install -d -m 0700 /root/.ssh
install -m 0600 in/authorized_keys /root/.ssh/authorized_keys
install -d -m 0755 /run/sshd

if [ -s in/sudo-user ] && [ -x /usr/bin/sudo ]; then
    IFS=: read -r user hash < in/sudo-user
    useradd --create-home --shell /bin/sh --password "$hash" "$user"
    install -d -m 0700 -o "$user" -g "$user" "/home/$user/.ssh"
    install -m 0600 -o "$user" -g "$user" in/authorized_keys "/home/$user/.ssh/"
    echo "$user ALL=(ALL:ALL) ALL" > "/etc/sudoers.d/fxkit-lab"
    chmod 0440 /etc/sudoers.d/fxkit-lab
fi

cat > /etc/ssh/fxkit-lab.conf <<EOF
ListenAddress $address:$port
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
UseDNS no
MaxStartups 200:30:400
MaxSessions 100
Subsystem sftp internal-sftp
EOF

# Drop the capabilities that reach past the namespaces: kernel modules, reboot, the clock, raw
# devices, device nodes, the (shared) network's configuration and mounting (undoing the
# read-only remounts above). sshd becomes PID 1 of the host.
exec setpriv --bounding-set \
    -sys_module,-sys_boot,-sys_time,-sys_rawio,-mknod,-net_admin,-sys_admin \
    /usr/sbin/sshd -D -e -f /etc/ssh/fxkit-lab.conf
