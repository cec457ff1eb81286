#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, for running the workflow through
# --profile profiles/slurm without a real cluster (docs/cluster.md).
#   usage: setup/slurm.sh start|stop|status
# start: installs slurm-wlm and munge when missing (setup/apt.sh), writes /etc/slurm/slurm.conf
#   (one node: this host at 127.0.0.1 with its cores and memory, partitions "local", the
#   default, and "gpu", the profile's GPU partition, on the same node) and gres.conf (one fake
#   GPU, /dev/null as its device: one without a device file is counted 0 and drains the node;
#   so `--gres=gpu:1` is granted, its jobs see CUDA_VISIBLE_DEVICES=0, and none has a GPU), starts
#   munged, slurmctld and slurmd, and waits until the node is idle. Running already: no change.
# stop: stops the three daemons and removes the slurm.conf and gres.conf start wrote (the state
#   and logs under /var/lib/audioparity-slurm stay): with a slurm.conf and no controller, every
#   snakemake start waits for a timeout, because the SLURM executor plugin asks
#   `scontrol show config` on import.
# No slurmdbd: jobs show in squeue while they run and for MinJobAge after, and every finished
# job is written to the job completion log (jobcomp.log in the state folder); the profile's
# status command is squeue (sacct needs slurmdbd).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
state=/var/lib/audioparity-slurm
conf=/etc/slurm/slurm.conf
gres=/etc/slurm/gres.conf
sudo=$([ "$(id -u)" = 0 ] || echo sudo)

# a daemon that forked leaves a zombie parent until it is reaped: live states only
running() { pgrep --runstates D,R,S,T -x "$1" >/dev/null; }

write_conf() {
    local host cpus memory
    host=$(hostname -s)
    cpus=$(nproc)
    memory=$(($(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo) - 1024))
    $sudo mkdir -p /etc/slurm "$state/ctld" "$state/d"
    $sudo tee "$conf" >/dev/null <<EOF
# written by audioparity setup/slurm.sh: a one-node cluster on 127.0.0.1
ClusterName=audioparity
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/d
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/slurmctld.log
SlurmdLogFile=$state/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
ReturnToService=2
MinJobAge=600
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$state/jobcomp.log
GresTypes=gpu
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory Gres=gpu:1 State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=$host MaxTime=INFINITE State=UP
EOF
    $sudo tee "$gres" >/dev/null <<EOF
# written by audioparity setup/slurm.sh: one fake GPU (no GPU behind /dev/null)
NodeName=$host Name=gpu File=/dev/null
EOF
}

start() {
    "$here/apt.sh" slurm-wlm munge
    if running slurmctld && running slurmd && running munged; then
        echo "slurm: running already ($(sinfo -h -o '%n %T' 2>/dev/null))"
        return
    fi
    write_conf
    if ! running munged; then
        $sudo install -d -o munge -g munge -m 0755 /run/munge
        $sudo runuser -u munge -- /usr/sbin/munged
    fi
    running slurmctld || $sudo /usr/sbin/slurmctld
    running slurmd || $sudo /usr/sbin/slurmd
    for _ in $(seq 60); do
        if sinfo -h -o %T 2>/dev/null | grep -qx idle; then
            echo "slurm: node $(hostname -s) idle, partitions local and gpu ($conf)"
            return
        fi
        sleep 1
    done
    echo "slurm: the node did not come up in 60 s; see $state/slurmctld.log, $state/slurmd.log" >&2
    exit 1
}

stop() {
    for daemon in slurmd slurmctld munged; do
        if running "$daemon"; then $sudo pkill -x "$daemon"; fi
    done
    for _ in $(seq 30); do
        running slurmd || running slurmctld || running munged || {
            $sudo rm -f "$conf" "$gres"; echo "slurm: stopped"; return; }
        sleep 1
    done
    echo "slurm: a daemon is still running after 30 s" >&2
    exit 1
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) if running slurmctld; then sinfo; squeue; else echo "slurm: not running"; exit 1; fi ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
