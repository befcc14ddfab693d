"A real one-node SLURM cluster (tests/slurm_cluster.py) requeues a job and restarts it, its output appended to, none of its processes left behind."
import time
from slurm_cluster import slurm # the module-scoped cluster fixture

# SLURM_RESTART_COUNT is unset on a job's first run
SLEEPER = """#!/bin/bash
#SBATCH --requeue --open-mode=append
echo "start ${SLURM_RESTART_COUNT:-0}"
sleep 300
"""

def _gone(slurm, job_id, timeout=10):
    "Wait until no process of the job runs; return those still running"
    t0 = time.monotonic()
    while (left := slurm.procs_of(job_id)) and time.monotonic()-t0 < timeout: time.sleep(0.1)
    return left

def _started(slurm, j, timeout=10):
    "Wait until job `j`'s first run has written its first line (a job RUNNING may not have started its script yet)"
    t0 = time.monotonic()
    while 'start 0' not in slurm.output(j) and time.monotonic()-t0 < timeout: time.sleep(0.1)

def test_cluster_requeues(slurm):
    "`scontrol requeue` kills the job and runs it again, appending to its output"
    j = slurm.sbatch(SLEEPER)
    slurm.wait(j)
    _started(slurm, j) # requeued before its first line, the output would start with SLURM's notice
    slurm.requeue(j)
    slurm.wait_restart(j, 1, timeout=30) # ~5 s to kill the first run, ~7 s more before it starts again
    t0 = time.monotonic()
    while 'start 1' not in slurm.output(j) and time.monotonic()-t0 < 10: time.sleep(0.1)
    slurm.cancel(j)
    assert slurm.wait(j, 'CANCELLED', timeout=15)['Restarts'] == '1'
    assert slurm.output(j).splitlines()[0] == 'start 0' and 'start 1' in slurm.output(j).splitlines()
    assert not _gone(slurm, j)

def test_cluster_preempts(slurm):
    "A job in the `high` partition that needs the node's CPUs requeues the one running in `low`"
    low = slurm.sbatch(SLEEPER, f'--cpus-per-task={slurm.cpus}')
    slurm.wait(low)
    _started(slurm, low)
    high = slurm.sbatch('#!/bin/bash\nsleep 1\n', '--partition=high', f'--cpus-per-task={slurm.cpus}')
    slurm.wait(high, 'COMPLETED', timeout=30) # ~5 s to kill the low job first
    slurm.wait_restart(low, 1, timeout=30)
    t0 = time.monotonic()
    while 'start 1' not in slurm.output(low) and time.monotonic()-t0 < 10: time.sleep(0.1)
    slurm.cancel(low)
    slurm.wait(low, 'CANCELLED', timeout=15)
    out = slurm.output(low)
    assert 'DUE TO PREEMPTION' in out and out.splitlines()[0] == 'start 0' and 'start 1' in out.splitlines()
    assert not _gone(slurm, low)

# Training jobs: tests/scripts/dcp_resume.py (a 3-epoch fit checkpointing every 3 steps, resuming from the newest checkpoint)
# in a batch script written by `sbatch_script`, with `fastxtend-requeue` as the batch shell's command

import sys
from pathlib import Path
import numpy as np
from fastxtend_accel.requeue import sbatch_script
from fastxtend_accel.test_utils import torchrun_cmd
from test_dcp import RESUME, reference, results, close # the uninterrupted fit, in one process

def _train(slurm, out, n, *opts, sleep=0.3, time=None, warn=60):
    "Submit dcp_resume.py on `n` processes (under torchrun if n > 1), slowed to `sleep` s a batch; the job's id"
    cmd = ' '.join(map(str, ([sys.executable] if n == 1 else torchrun_cmd(n)) + [RESUME, out, '--tag', 's', '--sleep', sleep]))
    script = sbatch_script(cmd, time=time, warn=warn, requeue=str(Path(sys.executable).parent/'fastxtend-requeue'),
                           sbatch=['--export=ALL,OMP_NUM_THREADS=1,PYTHONWARNINGS=ignore', f'--cpus-per-task={slurm.cpus}', *opts])
    return slurm.sbatch(script)

def _until(cond, timeout, what):
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic()-t0 < timeout, what
        time.sleep(0.2)

def _training(out, at=(0, 6)):
    "Wait until the job trained past batch `at` of its first run"
    prog = out/'progress-s'
    _until(lambda: prog.exists() and tuple(map(int, prog.read_text().split())) >= at, 120, 'the job never trained')

def _resumed_exactly(slurm, j, out, n, reference):
    "The requeued run finished, resumed from the checkpoint taken on the signal, as the uninterrupted fit; nothing left running"
    info = slurm.wait(j, 'COMPLETED', timeout=180, restarts=1)
    assert info['Restarts'] == '1'
    log = slurm.output(j)
    r = results(out, 's', n)
    assert 'resume 1 of this run: it stopped on SIGTERM (SLURM restart 1)' in log, log[-3000:]
    assert log.count('epoch     train_loss') == 2 # both runs' output, appended
    for x in r: close(x['params'], reference[0]); close(x['ema'], reference[2])
    np.testing.assert_allclose(r[0]['values'], reference[1], atol=1e-6)
    assert not _gone(slurm, j)
    return log

def test_requeued_by_scontrol(slurm, tmp_path, reference):
    "`scontrol requeue` on 2 processes under torchrun: every process checkpoints on SLURM's SIGTERM; the job restarts and resumes"
    j = _train(slurm, tmp_path, 2)
    _training(tmp_path)
    slurm.requeue(j)
    log = _resumed_exactly(slurm, j, tmp_path, 2, reference)
    # SLURM's SIGTERM reached torchrun alone: said in one line, not as torchrun's chained tracebacks of a second one
    assert log.count('fastxtend-requeue: SLURM sent SIGTERM to every process of the job') == 1, log[-3000:]
    assert 'During handling of the above exception' not in log, log[-3000:]

def test_requeued_by_time_limit_signal(slurm, tmp_path, reference):
    """The signal SLURM sends the batch shell before the time limit (`--signal=B:USR1@60`: USR1 to the batch shell alone, sent
    here at once): one process without torchrun checkpoints, and `fastxtend-requeue` requeues the job"""
    j = _train(slurm, tmp_path, 1, '--time=10')
    _training(tmp_path)
    slurm.signal(j, 'USR1')
    log = _resumed_exactly(slurm, j, tmp_path, 1, reference)
    assert f'fastxtend-requeue: stopped on SIGUSR1; SLURM job {j} requeued' in log

def test_requeued_by_preemption(slurm, tmp_path, reference):
    "A job of the `high` partition preempts the training job (2 processes, torchrun): it checkpoints, is requeued, and resumes"
    j = _train(slurm, tmp_path, 2)
    _training(tmp_path)
    high = slurm.sbatch('#!/bin/bash\nsleep 1\n', '--partition=high', f'--cpus-per-task={slurm.cpus}')
    slurm.wait(high, 'COMPLETED', timeout=60)
    log = _resumed_exactly(slurm, j, tmp_path, 2, reference)
    assert 'DUE TO PREEMPTION' in log
    assert 'During handling of the above exception' not in log, log[-3000:]

def test_requeued_at_time_limit(slurm, tmp_path, reference):
    """A real time limit: 1 minute, USR1 to the batch shell 59 s before it, which slurmctld (checking every 30 s) sends 1 to 31 s
    after the job starts. Every run of the job that gets it checkpoints and is requeued, until one finishes; exact"""
    j = _train(slurm, tmp_path, 1, sleep=0.6, time='1', warn=59) # ~40 s in all: the first run is stopped
    info = slurm.wait(j, 'COMPLETED', timeout=400, restarts=1)
    log,n = slurm.output(j),int(info['Restarts'])
    assert log.count(f'fastxtend-requeue: stopped on SIGUSR1; SLURM job {j} requeued') == n, log[-3000:]
    r = results(tmp_path, 's', 1)
    close(r[0]['params'], reference[0]); close(r[0]['ema'], reference[2])
    np.testing.assert_allclose(r[0]['values'], reference[1], atol=1e-6)
    assert not _gone(slurm, j)
