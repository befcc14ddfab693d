"Smoke runs of the benchmarks with tiny sizes: they run and print their tables and targets (timings are read, never asserted)."
import re, sys
from conftest import REPO, run

def bench(script, *args): return run([sys.executable, REPO/'bench'/script, *map(str, args)], timeout=600).stdout

def rows(out, label):
    "The table rows of `out` whose first cell is `label`"
    return re.findall(rf'^\| {re.escape(label)}\s*\|.*$', out, re.M)

def test_bench_loop_smoke():
    out = bench('bench_loop.py', '--steps', 4, '--repeats', 1, '--hidden', 32, '--bs', 16)
    for variant in ('torch loop', 'Accelerate loop', 'fastai Learner', 'fastxtend_accel Learner', 'fastai TfmdDL (iterate)'): assert rows(out, variant)
    assert re.search(r'^target: fastxtend_accel Learner / Accelerate loop <= 1.05x: [\d.]+x -> (PASS|FAIL)$', out, re.M)

def test_bench_fastai_one_process_smoke():
    out = bench('bench_fastai.py', '--quick', '--sections', 'models', 'data', 'fits')
    assert len(rows(out, 'fastxtend_accel Learner')) == 3 # tiny and mid-size models, short fits
    for variant in ('torch loop', 'Accelerate loop', 'fastai Learner, TfmdDL', 'fastxtend_accel Learner, TfmdDL', 'TfmdDL (iterate)',
                    'Accelerate loop, one prepare'): assert rows(out, variant)
    for target in ('tiny: fastxtend_accel Learner / Accelerate loop', 'tiny: fastxtend_accel Learner / torch loop (next target)',
                   'mid-size: fastxtend_accel Learner / Accelerate loop', 'TfmdDL epoch: fastxtend_accel Learner / fastai Learner',
                   'short fits: fastxtend_accel Learner / fastai Learner'):
        assert re.search(rf'^\| {re.escape(target)} \| [\d.]+x \| [\d.]+x \| (PASS|FAIL) \|$', out, re.M), target

def test_bench_fastai_memory_smoke():
    out = bench('bench_fastai.py', '--quick', '--sections', 'memory')
    for variant in ('torch loop', 'Accelerate loop', 'fastai Learner', 'fastxtend_accel Learner'):
        peak = rows(out, variant)[0].split('|')[2]
        assert float(peak) > 50 # MiB: the process's peak RSS, torch included
    assert rows(out, 'peak memory (RSS): fastxtend_accel Learner / Accelerate loop')

def test_bench_fastai_two_processes_smoke():
    out = bench('bench_fastai.py', '--quick', '--sections', 'ddp')
    for variant in ('Accelerate DDP loop', 'fastxtend_accel Learner', 'the TfmdDL alone (iterate)', 'ShardedDL over the TfmdDL (iterate)'):
        assert rows(out, variant)
    # 8 batches per process in quick mode: one optimizer step and one gradient all-reduce (one DDP bucket) per batch
    assert rows(out, 'Accelerate DDP loop')[1].split('|')[2:4] == [' 8 ', ' 8 ']
    assert rows(out, 'fastxtend_accel Learner')[1].split('|')[2:4] == [' 8 ', ' 8 ']
    assert re.search(r'^\| 2 processes: gradient all-reduces == optimizer steps \| 8 == 8 \| \| PASS \|$', out, re.M)
