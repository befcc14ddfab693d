"Smoke runs of the benchmarks: they run and print their tables (speed targets are read from their output, not asserted)."
import sys
from conftest import REPO, run

def test_bench_loop_smoke():
    out = run([sys.executable, REPO/'bench'/'bench_loop.py', '--steps', '4', '--repeats', '1', '--hidden', '32', '--bs', '16']).stdout
    for variant in ('torch loop', 'Accelerate loop', 'fastai Learner', 'fastxtend_accel Learner', 'fastai TfmdDL'): assert variant in out
    assert 'target: fastxtend_accel Learner <= 1.05x the Accelerate loop' in out
