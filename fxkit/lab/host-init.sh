#!/bin/sh
# One lab host, in two steps (see docs/lab.md, "What a host is"):
#
#   unshare --mount host-init.sh outer NAME ADDRESS PORT HOST_DIR BASE_DIR TMPFS_BYTES [LAYER]
#
# "outer" runs as the real root in a private mount namespace. It joins the host's cgroups (the
# folders HOST_DIR/cgroups lists, one a line, made by fxkit/lab/resources.py: memory and pids
# limits) and builds the host's root file system in a tmpfs on HOST_DIR/rt: overlays (writable,
# in memory) over this machine's /usr and over the fleet's sanitised BASE_DIR/etc and /var; empty
# /root, /home, /tmp, /opt, /srv, /run; a /dev with six device nodes and a private devpts; the
# host's own key, name and sshd configuration. Then it execs unshare(1) into new user (uids
# 0-65535 mapped to themselves), PID, network, IPC, UTS, cgroup and mount namespaces, which runs
# step "inner" as PID 1 there: it forbids further user namespaces, mounts the host's /proc and a
# read-only /sys, pivots into the new root and detaches the old one (nothing of the real file
# system stays reachable), brings up the host's loopback interface and execs sshd with a reduced
# capability bounding set. Each tmpfs of the host holds TMPFS_BYTES at most.
# Nothing in the host keeps a file descriptor of the real machine: sshd's log is inside the host.
#
# With LAYER (a simulated hardware profile, built by fxkit/lab/profile.py) the host also
# gets the profile's stand-in tools (a lower layer of its /usr overlay), veth pairs named like
# the profile's RDMA netdevs, a /sys with the profile's grafts, a writable configfs stand-in and
# writable mlx5 ECN attributes on each of those netdevs, and keeps CAP_NET_ADMIN (in its own
# network namespace) to configure those interfaces.
set -eu
step=$1 name=$2 address=$3 port=$4 hostdir=$5 size=$7 layer=${8:-}
rt=$hostdir/rt
# Kept: what sshd, package scripts and user management need. Everything else is dropped from the
# bounding set (raw sockets, ptrace, the kernel log, perf, BPF, modules, raw I/O, mounts...).
caps=+chown,+dac_override,+fowner,+fsetid,+kill,+setgid,+setuid,+setpcap,+setfcap
caps=$caps,+net_bind_service,+sys_chroot,+audit_write
[ -z "$layer" ] || caps=$caps,+net_admin

if [ "$step" = outer ]; then
    base=$6
    # Into the host's cgroups first: all its processes start there, and its cgroup namespace
    # (made below) has its root there.
    while read -r cgroup; do echo $$ > "$cgroup/cgroup.procs"; done < "$hostdir/cgroups"
    mount -t tmpfs -o "mode=0700,size=$size" fxkit-lab "$rt"
    cd "$rt"
    # The layers by paths relative to here: the host's mount table (/proc/self/mountinfo) shows
    # the overlays' options, and names no folder of the real machine.
    base=$(realpath --relative-to=. "$base")
    [ -z "$layer" ] || layer=$(realpath --relative-to=. "$layer")
    mkdir root upper work sysfs
    for dir in usr etc var; do
        lower=$base/$dir
        [ "$dir" != usr ] || lower=/usr
        [ "$dir" != usr ] || [ -z "$layer" ] || lower=$layer/usr:/usr
        mkdir "upper/$dir" "work/$dir" "root/$dir"
        mount -t overlay fxkit-lab -o "lowerdir=$lower,upperdir=upper/$dir,workdir=work/$dir" "root/$dir"
    done
    for dir in bin sbin lib lib32 lib64 libx32; do
        if [ -L "/$dir" ]; then
            ln -s "$(readlink "/$dir")" "root/$dir"
        elif [ -d "/$dir" ]; then
            mkdir "root/$dir"
            mount --bind -o ro "/$dir" "root/$dir"
        fi
    done
    cp -a "$base/root" "$base/home" root/
    mkdir root/tmp root/opt root/srv root/run root/mnt root/media root/proc root/sys root/dev
    mkdir root/.oldroot
    # /tmp and /run are mounts of their own, as on most systems.
    mount -t tmpfs -o "mode=1777,size=$size,nosuid,nodev" fxkit-lab root/tmp
    mount -t tmpfs -o "mode=0755,size=$size,nosuid,nodev" fxkit-lab root/run
    mkdir -m 1777 root/run/lock
    mkdir -m 0755 root/run/sshd
    # The fleet's apt mirror (fxkit lab up --like: FLEET/mirror), read-only, as a node's apt
    # sees its site's mirror.
    if [ -d "$base/../mirror" ]; then
        mkdir -p root/srv/fxkit-lab-mirror
        mount --bind -o ro,nosuid,nodev,noexec "$base/../mirror" root/srv/fxkit-lab-mirror
    fi
    # A profile's hosts share one folder of the fleet (BASE_DIR/shared): the lab's wire, where
    # the stand-ins of two hosts meet (a perftest server sees its client on another host).
    if [ -n "$layer" ]; then
        mkdir -p root/run/fxkit-lab/shared
        mount --bind -o nosuid,nodev,noexec "$base/shared" root/run/fxkit-lab/shared
    fi

    # /dev: the harmless character devices, a private devpts and shm; no disks, kmsg, mem...
    mount -t tmpfs -o "mode=0755,size=$size,nosuid,noexec" fxkit-lab root/dev
    mknod -m 0666 root/dev/null c 1 3
    mknod -m 0666 root/dev/zero c 1 5
    mknod -m 0666 root/dev/full c 1 7
    mknod -m 0666 root/dev/random c 1 8
    mknod -m 0666 root/dev/urandom c 1 9
    mknod -m 0666 root/dev/tty c 5 0
    mkdir root/dev/pts root/dev/shm
    mount -t devpts -o newinstance,ptmxmode=0666,mode=0620,gid=5,nosuid,noexec fxkit-lab root/dev/pts
    ln -s pts/ptmx root/dev/ptmx
    mount -t tmpfs -o "mode=1777,size=$size,nosuid,nodev" fxkit-lab root/dev/shm
    # The profile's local NVMe drives: sparse files in the shared folder (a target's exports
    # are what its initiators see), linked from /dev.
    if [ -n "$layer" ] && [ -s "$layer/drives" ]; then
        mkdir -p "$base/shared/drives/$name"
        while read -r drive bytes; do
            [ -e "$base/shared/drives/$name/$drive" ] || truncate -s "$bytes" "$base/shared/drives/$name/$drive"
            ln -s "/run/fxkit-lab/shared/drives/$name/$drive" "root/dev/$drive"
        done < "$layer/drives"
    fi
    ln -s /proc/self/fd root/dev/fd
    ln -s /proc/self/fd/0 root/dev/stdin
    ln -s /proc/self/fd/1 root/dev/stdout
    ln -s /proc/self/fd/2 root/dev/stderr

    echo "$name" > root/etc/hostname
    mkdir root/etc/fxkit-lab
    profile=null
    [ -z "$layer" ] || profile="\"${layer##*/}\""
    printf '{"lab": true, "profile": %s}\n' "$profile" > root/etc/fxkit-lab/host.json
    printf '127.0.0.1\tlocalhost\n%s\t%s\n' "$address" "$name" > root/etc/hosts
    install -m 0600 "$hostdir/ssh_host_ed25519_key" root/etc/ssh/ssh_host_ed25519_key
    install -m 0644 "$hostdir/ssh_host_ed25519_key.pub" root/etc/ssh/ssh_host_ed25519_key.pub
    cat > root/etc/ssh/fxkit-lab.conf <<EOF
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

    # unshare maps the uids with newuidmap, which takes the ranges root may map from /etc/subuid:
    # give it one that says uids 0-65535, in this mount namespace only.
    echo "root:0:65536" > subid
    mount --bind subid /etc/subuid
    mount --bind subid /etc/subgid
    exec unshare --user --map-users=0,0,65536 --map-groups=0,0,65536 --setgroups=allow \
        --mount --pid --net --ipc --uts --cgroup --fork --kill-child \
        "$0" inner "$name" "$address" "$port" "$hostdir" - "$size" "$layer"
fi

# inner: PID 1 of the host's namespaces, still in the real file system (in $rt).
# No user namespaces inside the host (the limit is the host's user namespace's own; raising it
# again takes CAP_SYS_RESOURCE, which the host's root does not keep): a host's root cannot regain
# the dropped capabilities in namespaces of its own, and the kernel's surface stays smaller.
echo 0 > /proc/sys/user/max_user_namespaces
mount -t proc -o nosuid,nodev,noexec fxkit-lab root/proc
# The real kernel's settings and triggers stay read-only, even where the host's root owns them.
for entry in sys sysrq-trigger irq bus fs; do
    [ ! -e "root/proc/$entry" ] || mount --bind -o ro "root/proc/$entry" "root/proc/$entry"
done
# /sys read-only: the kernel's attributes can be read, none written; its network devices are the
# host's own (a sysfs mounted in the host's network namespace).
if [ -z "$layer" ]; then
    mount -t sysfs -o ro,nosuid,nodev,noexec fxkit-lab root/sys
else
    # The profile's interfaces first: the overlay below must see them when it is made.
    ip -batch "$layer/netdevs"
    # A read-only overlay of the profile's grafts (class/infiniband, module/nvme_core,
    # kernel/config, devices/virtual/net/IF/ecn) over the host's sysfs, and on kernel/config a
    # writable tmpfs: the configfs stand-in. Nothing is written to sysfs; reads of its
    # attributes go to the kernel's files.
    mount -t sysfs -o ro,nosuid,nodev,noexec fxkit-lab sysfs
    mount -t overlay fxkit-lab -o "ro,nosuid,nodev,noexec,lowerdir=$layer/sys:sysfs" root/sys
    mount -t tmpfs -o "mode=0755,size=$size,nosuid,nodev,noexec" fxkit-lab root/sys/kernel/config
    cp -a "$layer/config/." root/sys/kernel/config/
    # On each RDMA netdev's ecn folder (a graft) a small writable tmpfs with the ECN attributes
    # MLNX_OFED's mlx5 driver puts there (mode 0644), as a fresh port has them: all mounts in
    # one process, one mkdir for the folders ("$@" collects them), the files written by the
    # shell itself (a subshell: its umask and "$@" stay its own).
    mount --all --fstab "$layer/ecn.fstab"
    (
        umask 022
        set --
        while read -r _ ecn _; do
            while read -r file _; do set -- "$@" "$ecn/${file%/*}"; done < "$layer/ecn"
        done < "$layer/ecn.fstab"
        [ $# -eq 0 ] || mkdir -p "$@"
        while read -r _ ecn _; do
            while read -r file value; do printf '%s\n' "$value" > "$ecn/$file"; done < "$layer/ecn"
        done < "$layer/ecn.fstab"
    )
fi
# The new root must be a mount of this namespace (the outer one's are locked here).
mount --rbind root root
cd root
pivot_root . .oldroot
umount -l /.oldroot
rmdir /.oldroot
cd /
hostname "$name"
ip link set lo up
# From here on no descriptor of the real machine: not even the log file of the fleet. A session
# keyring of its own: the one this process inherited may hold keys of the real machine.
exec </dev/null >/dev/null 2>&1
exec keyctl session - setpriv --bounding-set "-all,$caps" --inh-caps -all \
    /usr/sbin/sshd -D -E /var/log/sshd.log -f /etc/ssh/fxkit-lab.conf
