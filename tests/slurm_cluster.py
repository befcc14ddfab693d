"""A real one-node SLURM cluster on localhost (Debian's `slurm-wlm` + `munge`) in a temporary directory, for the requeue tests.

Two partitions share the node: `low` (the default) and `high`; a job in `high` that needs the CPUs preempts (requeues) the
jobs running in `low`. SLURM's ports (6817/6818) are fixed, so one cluster runs at a time on the machine (a file lock
makes a second one wait). Accounting is off: `sacct` doesn't work, `job()` reads `scontrol show job`."""
import fcntl, os, re, shutil, signal, socket, subprocess, tempfile, time
from pathlib import Path
import pytest

COMMANDS = ('munged', 'slurmctld', 'slurmd', 'sbatch', 'scontrol')
LOCK = Path('/tmp/fastxtend_accel_slurm.lock')
# the states a job doesn't leave (a requeue or preemption goes through REQUEUED/PENDING instead)
ENDED = ('COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'NODE_FAIL', 'OUT_OF_MEMORY', 'BOOT_FAIL', 'DEADLINE')

def slurm_available(install=True) -> str|None:
    "None if a cluster can be started here, else why not; installs the packages with apt when missing and root"
    if os.geteuid() != 0: return 'SLURM tests need root (slurmd runs the jobs as the submitting user, root)'
    if not all(shutil.which(d) for d in COMMANDS) and install and shutil.which('apt-get'):
        t0 = time.monotonic()
        inst = lambda: subprocess.run(['apt-get', 'install', '-y', '-qq', 'slurm-wlm', 'munge'], capture_output=True,
                                      env={**os.environ, 'DEBIAN_FRONTEND': 'noninteractive'}).returncode == 0
        if not inst(): subprocess.run(['apt-get', 'update', '-qq'], capture_output=True); inst()
        print(f'installed slurm-wlm and munge in {time.monotonic()-t0:.1f} s')
    missing = [d for d in COMMANDS if not shutil.which(d)]
    return f'not installed: {", ".join(missing)} (apt-get install slurm-wlm munge)' if missing else None

def _listening(port):
    with socket.socket() as s: return s.connect_ex(('127.0.0.1', port)) == 0

def _environ(pid):
    try: return Path(f'/proc/{pid}/environ').read_bytes().split(b'\0')
    except OSError: return [] # gone, or a kernel thread

def pids_with_env(var:str, value:str) -> list[int]:
    "PIDs of the processes whose environment holds `var=value` (what a job's processes inherit from slurmstepd)"
    me,entry = os.getpid(),f'{var}={value}'.encode()
    return [int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) != me and entry in _environ(p)]

class SlurmCluster:
    """munged, slurmctld and slurmd on localhost, configured in `path`; use as a context manager.
    `kill_wait`: KillWait, seconds from SIGTERM to SIGKILL when a job is requeued, cancelled, preempted or out of time
    (slurmd waits at least 5 s whatever is set). `grace_time`: GraceTime of `low`; above 0 a preempted batch job gets
    no signal at preemption and its SIGTERM comes ~12 s later, so 0 for tests. `extra_conf`: lines added to slurm.conf."""
    def __init__(self, path, cpus:int|None=None, kill_wait:int=5, grace_time:int=0, over_time_limit:int=0, extra_conf:str=''):
        self.path = Path(path)
        self.cpus = min(cpus or os.cpu_count(), os.cpu_count())
        self.kill_wait,self.grace_time,self.over_time_limit,self.extra_conf = kill_wait,grace_time,over_time_limit,extra_conf
        self.conf,self.procs,self.lock,self.munge = self.path/'slurm.conf',{},None,None
        self.env = {**os.environ, 'SLURM_CONF': str(self.conf)}

    def _write_conf(self):
        p,host,m = self.path,socket.gethostname().split('.')[0],self.munge
        for d in ('state', 'spool', 'jobs'): (p/d).mkdir(parents=True, exist_ok=True)
        key = m/'munge.key'
        key.write_bytes(os.urandom(1024)); key.chmod(0o400)
        self.conf.write_text(f"""ClusterName=test
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: 5 s is the lowest accepted; a requeued job can't restart before its old credential expires
AuthInfo=socket={m}/munge.socket.2,cred_expire=5
StateSaveLocation={p}/state
SlurmdSpoolDir={p}/spool
SlurmctldPidFile={p}/slurmctld.pid
SlurmdPidFile={p}/slurmd.pid
SlurmctldLogFile={p}/slurmctld.log
SlurmdLogFile={p}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
# the scheduler's pass every second, else a requeued job waits minutes to start again
SchedulerParameters=sched_interval=1
# a requeued job's output is appended to, not overwritten
JobFileAppend=1
KillWait={self.kill_wait}
OverTimeLimit={self.over_time_limit}
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
NodeName={host} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN
PartitionName=low Nodes={host} Default=YES PriorityTier=1 GraceTime={self.grace_time} MaxTime=INFINITE State=UP
PartitionName=high Nodes={host} PriorityTier=2 MaxTime=INFINITE State=UP
{self.extra_conf}
""")

    def _spawn(self, name, *args):
        log = open(self.path/f'{name}.out', 'wb')
        self.procs[name] = subprocess.Popen([name, *args], stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                            cwd=self.path, start_new_session=True)
        log.close()

    def _until(self, cond, timeout, what):
        t0 = time.monotonic()
        while not cond():
            dead = [n for n,p in self.procs.items() if p.poll() is not None]
            if dead or time.monotonic()-t0 > timeout:
                logs = '\n'.join(f'--- {f.name}\n' + f.read_text()[-2000:] for f in sorted(self.path.glob('*.out')) + sorted(self.path.glob('*.log')))
                raise RuntimeError(f'SLURM: {", ".join(dead)+" exited" if dead else "timed out"} waiting for {what}\n{logs}')
            time.sleep(0.1)

    def __enter__(self):
        self.lock = open(LOCK, 'w')
        fcntl.flock(self.lock, fcntl.LOCK_EX) # another cluster on this machine: wait for it to stop
        try:
            if _listening(6817) or _listening(6818): raise RuntimeError('SLURM ports 6817/6818 are taken: is another slurmctld/slurmd running?')
            # munged wants every directory above its socket open to all (pytest's tmp_path is 0700): a directory of its own
            self.munge = Path(tempfile.mkdtemp(prefix='munge-')); self.munge.chmod(0o755); m = self.munge
            self._write_conf()
            self._spawn('munged', '-F', '-f', f'--socket={m}/munge.socket.2', f'--key-file={m}/munge.key',
                        f'--pid-file={m}/munged.pid', f'--seed-file={m}/munged.seed', f'--log-file={self.path}/munged.log')
            self._until(lambda: (m/'munge.socket.2').exists(), 10, 'munged')
            self._spawn('slurmctld', '-D', '-c', '-f', str(self.conf))
            self._spawn('slurmd', '-D', '-f', str(self.conf))
            self._until(lambda: self.node_state() == 'IDLE', 30, 'the node to be idle')
        except BaseException: self.stop(); raise
        return self

    def __exit__(self, *exc): self.stop()

    def run(self, *args, check=True, **kw) -> str:
        "Run a SLURM client command (`scontrol`, `squeue`...) against this cluster, return its stdout"
        return subprocess.run(args, env=self.env, cwd=self.path/'jobs', capture_output=True, text=True, check=check, **kw).stdout.strip()

    def node_state(self) -> str:
        "The node's State as scontrol tells it: IDLE, MIXED, ALLOCATED, DOWN..."
        m = re.search(r'\bState=(\S+)', self.run('scontrol', 'show', 'node', '-o', check=False))
        return m.group(1) if m else ''

    def sbatch(self, script:str|Path, *args:str) -> int:
        "Submit `script` (a path, or a script's text) with sbatch's options `args`; return the job id; output goes to `path/jobs`"
        p = Path(script) if isinstance(script, Path) or '\n' not in script else None
        r = subprocess.run(['sbatch', '--parsable', *args] + ([str(p)] if p else []), input=None if p else script,
                           env=self.env, cwd=self.path/'jobs', capture_output=True, text=True)
        if r.returncode: raise RuntimeError(f'sbatch failed: {r.stderr}')
        return int(r.stdout.strip().split(';')[0])

    def job(self, job_id) -> dict:
        "The job's fields as `scontrol show job` tells them (JobState, Restarts, ExitCode, Reason, StdOut...); {} once forgotten"
        out = self.run('scontrol', 'show', 'job', '-o', str(job_id), check=False)
        if not out.startswith('JobId='): return {}
        # values may hold spaces (Command, WorkDir): a field runs until the next ` Key=`
        keys = list(re.finditer(r'(?:^| )([A-Za-z][\w/:]*)=', out))
        return {k.group(1): out[k.end():(keys[i+1].start() if i+1 < len(keys) else len(out))] for i,k in enumerate(keys)}

    def wait(self, job_id, states=('RUNNING',), timeout=60, restarts=0) -> dict:
        "Wait until the job is in one of `states` with Restarts >= `restarts`; return its fields"
        t0,states = time.monotonic(),(states,) if isinstance(states, str) else states
        while True:
            j = self.job(job_id)
            if j.get('JobState') in states and int(j.get('Restarts', 0)) >= restarts: return j
            # a job that ended otherwise won't get there: say how it ended, and what it printed
            if j.get('JobState') in ENDED or time.monotonic()-t0 > timeout:
                raise AssertionError(f'job {job_id} not {"/".join(states)} (restarts>={restarts}) after '
                                     f'{time.monotonic()-t0:.0f} s: {j}\n{self.output(job_id)[-3000:]}')
            time.sleep(0.2)

    def wait_restart(self, job_id, count=1, timeout=60) -> dict:
        "Wait until the job runs again for the `count`th time"
        return self.wait(job_id, 'RUNNING', timeout, restarts=count)

    def requeue(self, job_id): self.run('scontrol', 'requeue', str(job_id))
    def cancel(self, job_id): self.run('scancel', str(job_id))

    def signal(self, job_id, sig='USR1', full=False):
        "Send `sig` to the batch shell, or with `full` to its process group too (what a time limit's `--signal=B:` sends, at once)"
        self.run('scancel', '--full' if full else '--batch', f'--signal={sig}', str(job_id))

    def output(self, job_id) -> str:
        "What the job wrote to its StdOut so far"
        info = self.job(job_id) # StdOut as given: `%x` (the job's name) and `%j` (its id) not filled in
        f = Path((info.get('StdOut') or str(self.path/'jobs'/'slurm-%j.out')).replace('%x', info.get('JobName', '')).replace('%j', str(job_id)))
        return f.read_text() if f.exists() else ''

    def procs_of(self, job_id) -> list[int]:
        "PIDs of the job's processes still alive, wherever they went (own sessions, orphans): SLURM_JOB_ID in their environment"
        return pids_with_env('SLURM_JOB_ID', str(job_id))

    def stop(self):
        "Cancel every job, stop the daemons, kill whatever the cluster started and still runs"
        if 'slurmctld' in self.procs and self.procs['slurmctld'].poll() is None:
            self.run('scancel', '--user=root', '--full', '--signal=KILL', check=False, timeout=10)
            # slurmd shut down while its jobs are being killed takes seconds longer to exit
            t0 = time.monotonic()
            while self.run('squeue', '-h', '-t', 'R,CG', check=False) and time.monotonic()-t0 < 5: time.sleep(0.1)
            self.run('scontrol', 'shutdown', check=False, timeout=10)
        for name in ('slurmd', 'slurmctld', 'munged'):
            if (p := self.procs.pop(name, None)) is None: continue
            if p.poll() is None: p.terminate()
            try: p.wait(10)
            except subprocess.TimeoutExpired: p.kill(); p.wait()
        # job processes and slurmstepd outlive slurmd; they all inherited this cluster's SLURM_CONF
        for pid in pids_with_env('SLURM_CONF', str(self.conf)):
            try: os.kill(pid, signal.SIGKILL)
            except ProcessLookupError: pass
        if self.munge: shutil.rmtree(self.munge, ignore_errors=True); self.munge = None
        if self.lock: self.lock.close(); self.lock = None

@pytest.fixture(scope='module')
def slurm(tmp_path_factory):
    "A running cluster for the module's tests (skips when SLURM can't be had)"
    if why := slurm_available(): pytest.skip(why)
    with SlurmCluster(tmp_path_factory.mktemp('slurm')) as c: yield c
