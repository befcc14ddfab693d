"Launch helpers: run scripts under real launchers (torchrun, accelerate launch) as separate processes."
import os, socket, subprocess, sys
from pathlib import Path
import pytest

SCRIPTS = Path(__file__).parent/'scripts'
REPO = Path(__file__).parent.parent

def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]

def torchrun(n=2): return [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', str(n), '--master_port', str(free_port())]

def accelerate_launch(*flags):
    return [sys.executable, '-m', 'accelerate.commands.launch', '--main_process_port', str(free_port()), *flags]

def run(cmd, timeout=300, env=None, cwd=REPO):
    "Run `cmd`, failing the test with its output if it exits non-zero"
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONWARNINGS': 'ignore', **(env or {})}
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    if res.returncode != 0: pytest.fail(f"{' '.join(map(str, cmd))} exited {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-5000:]}")
    return res
