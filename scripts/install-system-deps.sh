#!/usr/bin/env bash
# Install the Debian packages the lab fleet and the benchmarks need, where they are missing.
# openssh-server: the lab's hosts run real sshd; fio: the storage limit in `fxkit bench load`;
# sshfs/fuse3 + iproute2: the emulated network filesystem of the remote-storage benchmark.
# The lab hosts' sandbox (docs/lab.md): util-linux (unshare, nsenter, setpriv, pivot_root), uidmap
# (newuidmap: each host's user namespace), socat (the relay into a host's network namespace),
# keyutils (a session keyring of its own per host), iproute2 (the host's loopback interface).
# sudo + openssl: the lab hosts' non-root user that becomes root with a password (tests of become).
# dpkg-dev: dpkg-scanpackages, for the local apt repository of the packages tests on lab hosts.
# gnupg: gpg signs the lab's apt mirror (fxkit lab up --like, fxkit/lab/mirror.py).
# libfuse3-dev + pkg-config: the latency FUSE passthrough (bench/latency_fuse/) is compiled here.
# python3-minimal: a system python3 for the lab hosts (the HTTP server of the wait_for tests).
# xfsprogs: mkfs.xfs, for the NVMe-oF initiator's filesystem tests on lab hosts.
# rsync: a baseline of the staging benchmark (bench/stage.py).
# chromium: the gate reports' HTML page is opened and screenshotted headless (tests, docs/img/).
# netcat-openbsd: nc, the raw TCP client of the serve-probe tests (hostile requests).
# stress-ng: the load the whole suite is run under to prove it does not flake (docs/TESTING.md).
# procps: ps, which lists a session's processes on lab hosts (the rollout's surge memory check,
#   fxkit/facts/system.py SessionMemory).
# systemd-timesyncd: the service of docs/HOWTO-ROLE.md's example role, which its test runs on a
#   lab host (lab hosts use this machine's /usr).
# systemd-container + debootstrap: the lab host where systemd runs (tests/systemd_host.py: a
#   Debian tree booted by systemd-nspawn); systemd-container at the version of the systemd
#   installed here, so that installing it upgrades nothing.
set -euo pipefail
need=()
command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v fio >/dev/null || need+=(fio)
command -v sshfs >/dev/null || need+=(sshfs fuse3)
command -v ip >/dev/null || need+=(iproute2)
command -v unshare >/dev/null || need+=(util-linux)
command -v nsenter >/dev/null || need+=(util-linux)
command -v newuidmap >/dev/null || need+=(uidmap)
command -v socat >/dev/null || need+=(socat)
command -v keyctl >/dev/null || need+=(keyutils)
command -v sudo >/dev/null || need+=(sudo)
command -v openssl >/dev/null || need+=(openssl)
command -v dpkg-scanpackages >/dev/null || need+=(dpkg-dev)
command -v gpg >/dev/null || need+=(gnupg)
command -v pkg-config >/dev/null || need+=(pkg-config)
[ -e /usr/include/fuse3/fuse.h ] || need+=(libfuse3-dev)
[ -x /usr/bin/python3 ] || need+=(python3-minimal)
command -v mkfs.xfs >/dev/null || [ -x /usr/sbin/mkfs.xfs ] || need+=(xfsprogs)
command -v rsync >/dev/null || need+=(rsync)
command -v chromium >/dev/null || need+=(chromium)
command -v nc >/dev/null || need+=(netcat-openbsd)
command -v stress-ng >/dev/null || need+=(stress-ng)
command -v ps >/dev/null || need+=(procps)
[ -x /usr/lib/systemd/systemd-timesyncd ] || need+=(systemd-timesyncd)
# newuidmap reads /etc/subuid and /etc/subgid, which a minimal image may lack: empty files do
# (the lab maps its uids in its own mount namespace and never writes them).
if [ "$(id -u)" = 0 ]; then
    for f in /etc/subuid /etc/subgid; do [ -e "$f" ] || touch "$f"; done
fi
command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
if ! command -v systemd-nspawn >/dev/null; then
    systemd=$(dpkg-query -W -f '${Version}' systemd 2>/dev/null || true)
    need+=("systemd-container${systemd:+=$systemd}")
fi
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "missing Debian packages: ${need[*]}; install them with: sudo apt-get install ${need[*]}" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
if ! apt-get install -y -q --no-install-recommends "${need[@]}"; then
    # The mirror may no longer have this systemd's version: take its own.
    apt-get install -y -q --no-install-recommends "${need[@]/%=*/}"
fi
