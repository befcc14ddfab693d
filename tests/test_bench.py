"""Smoke runs of the benchmarks with tiny sizes: every section runs and prints its rows, timings are well-formed numbers, and
each target's verdict is the one its printed ratio and limit give. Whether a target is met is read, never asserted."""
import json, re, sys
import pytest
from fastxtend_accel.test_utils import run_cmd
from conftest import REPO

NUM = r'\d+\.\d+'

def bench(script, *args): return run_cmd([sys.executable, REPO/'bench'/script, *map(str, args)], timeout=600, cwd=REPO).stdout

def rows(out, label):
    "The table rows of `out` whose first cell is `label`"
    return re.findall(rf'^\| {re.escape(label)}\s*\|.*$', out, re.M)

def cells(out, label, i=0):
    "The cells after the first of the `i`-th table row of `out` whose first cell is `label`"
    found = rows(out, label)
    assert len(found) > i, f'no row {label!r} in\n{out}'
    return [c.strip() for c in found[i].strip('|').split('|')[1:]]

def timing(out, label):
    "The median of the timing row `label` (median, min-max, ...), checked to be a positive number between the min and max"
    med,span = cells(out, label)[:2]
    assert re.fullmatch(NUM, med) and re.fullmatch(rf'{NUM}-{NUM}', span), (label, med, span)
    lo,hi = map(float, span.split('-'))
    assert 0 < float(med) and lo <= float(med) <= hi, (label, med, span)
    return float(med)

def judged(value, limit, verdict, met=('PASS', 'FAIL')):
    "Whether `verdict` is the one `value <= limit` gives (allowing for `value` rounded to 3 decimals on the limit)"
    return verdict == met[value > limit] or abs(value - limit) <= 5e-4

def summary(out):
    "The targets of the summary table ending `out`: `{name: (measured, limit, result)}`, each result checked against its numbers"
    res = {}
    for line in out[out.index('| target (issue 12) |'):].splitlines()[2:]:
        name,measured,limit,verdict = [c.strip() for c in line.strip('|').split('|')]
        if limit: # else a count, judged by the benchmark alone
            assert re.fullmatch(rf'{NUM}x', measured) and re.fullmatch(r'[\d.]+x', limit), line
            assert judged(float(measured[:-1]), float(limit[:-1]), verdict), line
        res[name] = measured,limit,verdict
    return res

def test_bench_loop_smoke():
    out = bench('bench_loop.py', '--steps', 4, '--repeats', 1, '--hidden', 32, '--bs', 16)
    for variant in ('torch loop', 'Accelerate loop', 'fastai Learner', 'fastxtend_accel Learner', 'fastai TfmdDL (iterate)'):
        timing(out, variant)
    assert cells(out, 'Accelerate loop')[2] == '1.000x'
    m = re.search(rf'^target: fastxtend_accel Learner / Accelerate loop <= ({NUM})x: ({NUM})x -> (PASS|FAIL)$', out, re.M)
    assert m, out
    assert cells(out, 'fastxtend_accel Learner')[2] == f'{m[2]}x' # the table's ratio
    assert judged(float(m[2]), float(m[1]), m[3]), m[0]

TARGETS = ('tiny: fastxtend_accel Learner / Accelerate loop', 'tiny: fastxtend_accel Learner / torch loop (next target)',
           'mid-size: fastxtend_accel Learner / Accelerate loop', 'TfmdDL epoch: fastxtend_accel Learner / fastai Learner',
           'short fits: fastxtend_accel Learner / fastai Learner')

def test_bench_fastai_one_process_smoke():
    out = bench('bench_fastai.py', '--quick', '--sections', 'models', 'data', 'fits')
    assert len(rows(out, 'fastxtend_accel Learner')) == 3 # tiny and mid-size models, short fits
    for variant in ('torch loop', 'Accelerate loop', 'fastai Learner, TfmdDL', 'fastxtend_accel Learner, TfmdDL', 'TfmdDL (iterate)',
                    'Accelerate loop, one prepare'): timing(out, variant)
    assert list(summary(out)) == list(TARGETS)

def test_bench_fastai_memory_smoke():
    out = bench('bench_fastai.py', '--quick', '--sections', 'memory')
    for variant in ('torch loop', 'Accelerate loop', 'fastai Learner', 'fastxtend_accel Learner'):
        assert float(cells(out, variant)[0]) > 50 # MiB: the process's peak RSS, torch included
    assert list(summary(out)) == ['peak memory (RSS): fastxtend_accel Learner / Accelerate loop',
                                  'RSS growth while training: fastxtend_accel Learner / Accelerate loop']

def test_bench_fastai_two_processes_smoke():
    out = bench('bench_fastai.py', '--quick', '--sections', 'ddp')
    for variant in ('Accelerate DDP loop', 'fastxtend_accel Learner', 'the TfmdDL alone (iterate)', 'ShardedDL over the TfmdDL (iterate)'):
        timing(out, variant)
    # 8 batches per process in quick mode: one optimizer step and one gradient all-reduce (one DDP bucket) per batch
    assert cells(out, 'Accelerate DDP loop', 1)[:2] == ['8', '8']
    assert cells(out, 'fastxtend_accel Learner', 1)[:2] == ['8', '8']
    targets = summary(out)
    assert list(targets) == ['2 processes: fastxtend_accel Learner / Accelerate DDP loop',
                             '2 processes: gradient all-reduces == optimizer steps',
                             '2 processes: ShardedDL over a TfmdDL / the TfmdDL alone']
    assert targets['2 processes: gradient all-reduces == optimizer steps'] == ('8 == 8', '', 'PASS')

def test_bench_gpu_smoke():
    "The GPU benchmark on the CPU, tiny: no GPU needed"
    out = bench('bench_gpu.py', '--device', 'cpu', '--tiny')
    for v in ('torch loop', 'Accelerate loop', 'fastxtend_accel Learner', 'Accelerate loop + compile', 'fastxtend_accel Learner + compile'):
        med = cells(out, v)[0]
        assert re.fullmatch(r'\d+\.\d\d', med) and float(med) > 0, (v, med) # ms/step
    assert cells(out, 'Accelerate loop')[3] == cells(out, 'Accelerate loop + compile')[3] == '1.000x'
    for learner,loop in (('fastxtend_accel Learner', 'Accelerate loop'), ('fastxtend_accel Learner + compile', 'Accelerate loop + compile')):
        m = re.search(rf"^target: {re.escape(learner)} <= 1.03x the {re.escape(loop)}: ({NUM})x -> (met|NOT met)", out, re.M)
        assert m and cells(out, learner)[3] == f'{m[1]}x', out
        assert judged(float(m[1]), 1.03, m[2], met=('met', 'NOT met')), m[0]

def test_bench_async_save_smoke(tmp_path):
    "Checkpoint stalls and the checksums' cost: every fit's line, the side-by-side table, each verdict from its ratio"
    out = bench('bench_async_save.py', tmp_path, '--width', 64, '--epochs', 1, '--fits', 1, '--repeats', 1)
    fits = [json.loads(l) for l in out.splitlines() if l.startswith('{')]
    assert sorted(f['mode'] for f in fits) == ['async', 'async-off', 'none', 'sync', 'sync-off']
    assert all(f['checkpoints'] > 0 for f in fits if f['mode'] != 'none')
    for label in ('sync save', 'async save returns', 'load, verified (CRC32C)', "fit's stall per sync checkpoint",
                  "fit's stall per async checkpoint"):
        row = cells(out, label) # ms, ms, ratio (the median of each round's: not the ratio of the two medians), ...
        assert float(row[0]) > 0 and float(row[1]) > 0 and re.fullmatch(rf'{NUM}x', row[2]), (label, row)
    speeds = re.search(r'^Checksum speeds over .*', out, re.M)
    assert speeds and all(re.search(rf'\b{k} {NUM} GB/s', speeds[0]) for k in ('crc32c', 'crc32')), out
    for m in re.finditer(rf'^target: .* <= ({NUM}): ({NUM})x -> (PASS|FAIL)$', out, re.M):
        assert judged(float(m[2]), float(m[1]), m[3]), m[0]
    assert len(re.findall(r'^target: ', out, re.M)) == 3

def test_bench_store_smoke():
    "Checkpoints in S3 (moto's server, started by the benchmark) against a local folder: every mode's line, the table, the verdict"
    out = bench('bench_store.py', '--width', 64, '--epochs', 1, '--every', 5, '--fits', 1)
    fits = [json.loads(l) for l in out.splitlines() if l.startswith('{')]
    assert sorted((f['mode'], f['store']) for f in fits) == [('async', 'local'), ('async', 's3'), ('none', 'local'),
                                                           ('sync', 'local'), ('sync', 's3')]
    assert all(f['ckpts'] > 0 for f in fits)
    for mode in ('sync', 'async'):
        row = cells(out, f'{mode}: stall per checkpoint')
        assert float(row[0]) > 0 and float(row[1]) > 0 and re.fullmatch(rf'{NUM}x', row[2]), (mode, row)
    m = re.search(rf'^target: .* <= ({NUM}): ({NUM})x -> (PASS|FAIL)$', out, re.M)
    assert m and judged(float(m[2]), float(m[1]), m[3]), out

def test_bench_monitors_smoke():
    "The monitors' cost per step: every variant's row, its ratio to the fit without them, the verdict from that ratio"
    out = bench('bench_monitors.py', '--steps', 4, '--repeats', 1, '--hidden', 32, '--bs', 16)
    for variant in ('monitors off', 'ThroughputCallback', 'ThroughputCallback(phases=False)', 'monitor() (throughput, memory)',
                    'monitor() + TensorBoard every 10 steps'):
        timing(out, variant)
    assert cells(out, 'monitors off')[2] == '1.000x'
    m = re.search(rf'^target: monitor\(\) / monitors off <= ({NUM})x: ({NUM})x -> (PASS|FAIL)$', out, re.M)
    assert m and cells(out, 'monitor() (throughput, memory)')[2] == f'{m[2]}x', out
    assert judged(float(m[2]), float(m[1]), m[3]), m[0]

def test_bench_peers_smoke():
    "One interleaved repeat on 1 and 2 processes: every runner trained a whole epoch; ratios are those of the medians"
    out = bench('bench_peers.py', '--procs', 1, 2, '--models', 'A', '--repeats', 1,
                '--runners', 'torch', 'accelerate', 'accel')
    for i,steps in enumerate((449, 224)): # 28,752 items in batches of 64 per process, the last one dropped
        acc_wall = float(cells(out, 'Accelerate loop', i)[2])
        acc_cpu_all = i and float(cells(out, 'Accelerate loop', i)[10])
        for label in ('torch loop', 'Accelerate loop', 'fastxtend_accel Learner, from_dsets'):
            row = cells(out, label, i)
            runs,n,wall,span,vs_acc,vs_torch,cpu,*_,loss,acc = row
            assert (runs, n) == ('1', str(steps)) and float(loss) < 0.2 and float(acc) > 0.95, (label, out)
            # the ratio of the unrounded medians; these are rounded to 3 decimals
            assert abs(float(vs_acc[:-1]) - float(wall)/acc_wall) < 2e-3, (label, out)
            # on 2 processes, the mean of both processes' CPU times too (from the second's own clock)
            assert len(row) == 12 + 2*i, (label, out)
            if i: assert float(row[10]) > 0 and abs(float(row[11][:-1]) - float(row[10])/acc_cpu_all) < 2e-3, (label, out)
        assert cells(out, 'Accelerate loop', i)[4] == '1.000x' and cells(out, 'torch loop', i)[5] == '1.000x'

def test_bench_peers_targets():
    "The targets table of made-up runs: each ratio is the one its clock's runs give, and the verdict the CPU medians'"
    sys.path.insert(0, str(REPO/'bench'))
    try: import bench_peers as bp
    finally: sys.path.remove(str(REPO/'bench'))
    def runs(cpus, cpus_all=None): # ms a step over 100 steps; wall 1 ms over the CPU time
        return [dict(steps=100, cpu=c/10, wall=(c+1)/10, cpu_all=a/10) for c,a in zip(cpus, cpus_all or cpus)]
    fabric = runs([2.5, 2, 5], [2.5, 2, 4])
    results = {(2, 'A', 'accel-datablock'): runs([2, 3, 4], [2, 2.6, 3.6]), (2, 'A', 'fabric'): fabric,
               (2, 'A', 'accel'): runs([2]) + [dict(error='exit 1')] + runs([3])}
    out = bp.targets(results, [2], ['A', 'B'])
    # wall 4/3.5; CPU medians 3/2.5, paired median of 2/2.5, 3/2, 4/5, fastest 2/2; mean of processes 2.6/2.5, paired
    # median of 2/2.5, 2.6/2, 3.6/4
    assert cells(out, 'fastxtend_accel Learner, DataBlock / Lightning Fabric, model A') == [
        '2', '1.143x', '1.200x', '0.800x', '1.000x', '1.040x', '0.900x', '1.10x', 'FAIL'], out
    # the failed run left out, and its repeat's pair: paired median of 2/2.5 and 3/5, of 2/2.5 and 3/4
    assert cells(out, 'fastxtend_accel Learner, from_dsets / Lightning Fabric, model A') == [
        '2', '1.000x', '1.000x', '0.700x', '1.000x', '1.000x', '0.775x', '1.10x', 'PASS'], out
    assert len(rows(out, 'fastxtend_accel Learner, Datasets / Lightning Fabric, model A')) == 0 # no runs, no row
    # the job's CPU time: process 0's 4 s over 100 steps and another's 1 s over 50 (2 s over 100)
    assert bp.job_cpu(dict(cpu=4, steps=100), [dict(cpu=1, steps=50)], 2) == 3
    with pytest.raises(ValueError, match='1 of the other processes wrote no times'): bp.job_cpu(dict(cpu=4, steps=100), [], 2)

def test_bench_activations_smoke():
    "Each model's two rows (memory, then timings); checkpointed, a step's peak memory is below the one that keeps them all"
    out = bench('bench_activations.py', '--steps', 4, '--repeats', 1)
    for i in range(3):
        kept,ckpt = cells(out, 'kept', i),cells(out, 'checkpointed', i)
        for c in (kept, ckpt): assert re.fullmatch(NUM, c[0]) and float(c[0]) > 0, out
        assert float(ckpt[0]) < float(kept[0]), out # measured 0.46x-0.71x (bench/bench_activations.py's defaults)
    assert len(re.findall(rf'checkpointed / kept: memory {NUM}x, time {NUM}x', out)) == 3

def test_bench_microbatch_smoke():
    "Each model's three rows; in quarters, a step's peak memory is below the whole batch's"
    out = bench('bench_microbatch.py', '--steps', 3, '--repeats', 1)
    for i,quarter in enumerate(['micro_bs=64', 'micro_bs=16']): # a quarter of the MLP's 256, of the CNN's 64
        whole,quarter = cells(out, 'whole batches', i),cells(out, quarter)
        for c in (whole, quarter): assert re.fullmatch(NUM, c[0]) and float(c[0]) > 0, out
        assert float(quarter[0]) < float(whole[0]), out # measured 0.25x (bench/bench_microbatch.py's defaults)
    assert len(re.findall(rf'quarters / whole: memory {NUM}x, time {NUM}x; auto / whole: time {NUM}x', out)) == 2
