"Paths and launch helpers for the tests; the helpers themselves are `fastxtend_accel.test_utils`'s."
import sys
from pathlib import Path
import pytest
from fastxtend_accel.test_utils import free_port, torchrun_cmd, accelerate_launch_cmd, run_cmd

SCRIPTS = Path(__file__).parent/'scripts'
REPO = Path(__file__).parent.parent

def torchrun(n=2): return torchrun_cmd(n)

def accelerate_launch(*flags): return accelerate_launch_cmd(*flags)

def run(cmd, timeout=300, env=None, cwd=REPO):
    "Run `cmd`, failing the test with its output if it exits non-zero"
    try: return run_cmd(cmd, timeout=timeout, env=env, cwd=cwd)
    except RuntimeError as e: pytest.fail(str(e))
