#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, for running the workflow through
# --profile profiles/slurm without a real cluster (docs/cluster.md).
#   usage: setup/slurm.sh start|stop|status
# start: installs slurm-wlm and munge when missing (setup/apt.sh), writes /etc/slurm/slurm.conf
#   (one node: this host at 127.0.0.1 with its cores and memory, partition "local"), starts
#   munged, slurmctld and slurmd, and waits until the node is idle. Running already: no change.
# stop: stops the three daemons and removes the slurm.conf start wrote (the state and logs under
#   /var/lib/audioparity-slurm stay): with a slurm.conf and no controller, every snakemake start
#   waits for a timeout, because the SLURM executor plugin asks `scontrol show config` on import.
# No slurmdbd: jobs show in squeue while they run and for MinJobAge after, and every finished
# job is written to the job completion log (jobcomp.log in the state folder); the profile's
# status command is squeue (sacct needs slurmdbd).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
state=/var/lib/audioparity-slurm
conf=/etc/slurm/slurm.conf
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
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
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
            echo "slurm: node $(hostname -s) idle, partition local ($conf)"
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
            $sudo rm -f "$conf"; echo "slurm: stopped"; return; }
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
