"""The monitors, Accelerate's trackers and the profiler on real launches of 1 and 2 processes, each a fit stopped after a
checkpoint and resumed in a new launch: judged by what TensorBoard, MLflow and W&B wrote, read back with their own readers,
and by the traces, pictures and results the processes wrote."""
import json, struct, subprocess, sys
import pytest, torch
from fastxtend_accel.test_utils import torchrun_cmd, run_ranks
from conftest import SCRIPTS

tb_reader = pytest.importorskip('tensorboard.backend.event_processing.event_accumulator')
mlflow = pytest.importorskip('mlflow')
wandb_pb = pytest.importorskip('wandb.proto.wandb_internal_pb2')

SCENARIOS = SCRIPTS/'monitor_scenarios.py'

def _env(work):
    "Each tracker's settings: MLflow's local file store, W&B offline (never the network)"
    return dict(MLFLOW_TRACKING_URI=(work/'mlruns').as_uri(), MLFLOW_ALLOW_FILE_STORE='true', WANDB_MODE='offline',
                WANDB_DIR=str(work), WANDB_SILENT='true')

def launch(n, out, work, *args):
    "Run monitor_scenarios.py on `n` processes (1: a plain process) with the three trackers; each rank's results"
    out.mkdir(parents=True)
    cmd = ([sys.executable] if n == 1 else torchrun_cmd(n)) + [SCENARIOS, out, work, '--trackers', 'tensorboard,mlflow,wandb', *args]
    return run_ranks(cmd, out, n, env=_env(work))

@pytest.fixture(scope='module', params=[1, 2], ids=['1proc', '2procs'])
def run(request, tmp_path_factory):
    """2 epochs of 256 training items in batches of 16 per process, stopped after the checkpoint at step 4 of epoch 1 (steps
    are every 4), resumed from it in a new launch: (processes, work folder, first launch's results, last launch's results)"""
    n = request.param
    tmp = tmp_path_factory.mktemp(f'monitors{n}')
    first = launch(n, tmp/'a', tmp/'work', '--stop', '1,3')
    last = launch(n, tmp/'b', tmp/'work')
    assert not first[0]['resumed'] and last[0]['resumed']
    return n, tmp, first, last

def batches(n): return 256//(16*n) # training batches per epoch, per process

def col(res, name): return [v[res['names'].index(name) - 1] for v in res['values']]

def contiguous(steps, n): return sorted(steps) == steps == list(range(1, 2*batches(n) + 1))

def test_tensorboard(run):
    "One run (the main process's), steps 1..N once each across both launches, the Recorder's values"
    n,tmp,_,(main,*_) = run
    folder = tmp/'work'/'tb'/'digits'
    assert len(list(folder.glob('events.out.tfevents.*'))) == 2 # a writer per launch, on the main process only
    ea = tb_reader.EventAccumulator(str(folder)).Reload()
    loss = ea.Scalars('smooth_loss')
    assert contiguous([e.step for e in loss], n)
    assert torch.allclose(torch.tensor([e.value for e in loss]), torch.tensor(main['losses']))
    assert torch.allclose(torch.tensor([e.value for e in ea.Scalars('lr')]), torch.tensor(main['lrs'], dtype=torch.float32))
    for name in ('valid_loss', 'accuracy', 'items_s', 'rss_peak_mb'):
        ev = ea.Scalars(name)
        assert [e.step for e in ev] == [batches(n), 2*batches(n)]
        assert torch.allclose(torch.tensor([e.value for e in ev]), torch.tensor(col(main, name), dtype=torch.float32))

def test_mlflow(run, monkeypatch):
    "One run, continued by the resumed launch: steps 1..N once each, the Recorder's values, the fit's hyper-parameters"
    n,tmp,first,(main,*_) = run
    monkeypatch.setenv('MLFLOW_ALLOW_FILE_STORE', 'true')
    client = mlflow.tracking.MlflowClient((tmp/'work'/'mlruns').as_uri())
    exp = client.get_experiment_by_name('digits')
    runs = client.search_runs([exp.experiment_id])
    assert [r.info.run_id for r in runs] == [first[0]['run_kwargs']['mlflow']['run_id']]
    r = runs[0]
    assert r.info.status == 'FINISHED'
    hist = client.get_metric_history(r.info.run_id, 'smooth_loss')
    assert contiguous([m.step for m in hist], n)
    assert torch.allclose(torch.tensor([m.value for m in sorted(hist, key=lambda m: m.step)]), torch.tensor(main['losses']))
    acc = sorted(client.get_metric_history(r.info.run_id, 'accuracy'), key=lambda m: m.step)
    assert [(m.step, m.value) for m in acc] == list(zip([batches(n), 2*batches(n)], col(main, 'accuracy')))
    p = r.data.params
    assert (p['num_processes'], p['global_bs'], p['lr_max'], p['n_epoch'], p['seed']) == (str(n), str(16*n), '0.01', '2', '42')

def _wandb_history(run_dir):
    """The history rows in a W&B offline run's `.wandb` file, with W&B's own record definitions: the file is W&B's header
    (7 bytes) then LevelDB's log format (32 KiB blocks of records: crc32, length, type) of protobuf `Record`s"""
    data = next(run_dir.glob('run-*.wandb')).read_bytes()
    assert data[:4] == b':W&B'
    pos,block,buf,rows = 7,32768,b'',[]
    while pos + 7 <= len(data):
        if block - pos%block < 7: pos += block - pos%block; continue # a block's tail, too short for a header
        _,size,kind = struct.unpack('<IHB', data[pos:pos+7])
        if kind == 0: break # zeros: the end of what was written
        buf,pos = buf + data[pos+7:pos+7+size],pos+7+size
        if kind not in (1, 4): continue # a record's first or middle part
        rec = wandb_pb.Record()
        rec.ParseFromString(buf)
        buf = b''
        if rec.WhichOneof('record_type') == 'history':
            rows.append({i.key or '/'.join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
    return rows

def test_wandb_offline(run):
    "The resumed launch continues the same run id, from the next step: each step once, the Recorder's values"
    n,tmp,first,(main,*_) = run
    dirs = sorted((tmp/'work'/'wandb').glob('offline-run-*'))
    run_id = first[0]['run_kwargs']['wandb']['id']
    assert len(dirs) == 2 and all(d.name.endswith(run_id) for d in dirs)
    rows = [r for d in dirs for r in _wandb_history(d)]
    loss = [(r['_step'], r['smooth_loss']) for r in rows if 'smooth_loss' in r]
    assert contiguous([s for s,_ in loss], n)
    assert torch.allclose(torch.tensor([v for _,v in loss]), torch.tensor(main['losses']))
    assert [r['valid_loss'] for r in rows if 'valid_loss' in r] == pytest.approx(col(main, 'valid_loss'))

def test_monitor_columns(run):
    """Throughput and memory columns from every process's row: the items each process trained (the first batch of a fit
    counts FLOPs and is left out), the FLOPs of the MLP per batch, MFU from them; the epoch before the checkpoint kept"""
    n,_,_,last = run
    main = last[0]
    assert main['names'][4:-1] == ['items_s', 'batches_s', 'data_pct', 'fwd_pct', 'bwd_pct', 'opt_pct', 'mfu_pct', 'rss_mb',
                                   'rss_peak_mb']
    tp = main['throughput']
    assert [h['epoch'] for h in tp] == [0, 1]
    assert [[row[:2] for row in h['per_process']] for h in tp] == [[[16.*(b-1), b-1.]]*n for b in (batches(n), batches(n)-4)]
    mm = lambda i,o: 2*16*i*o
    flops = 2*mm(64, 64) + 3*mm(64, 10)
    for h in tp:
        rows = torch.tensor(h['per_process'], dtype=torch.float64)
        assert (rows[:, -1] == flops).all()
        wall = rows[:, 3].max()
        assert h['items_s'] == pytest.approx((rows[:, 0].sum()/wall).item())
        assert h['mfu_pct'] == pytest.approx((100*flops*rows[:, 1].sum()/wall/(1e9*n)).item())
        assert sum(h[k] for k in ('data_pct', 'fwd_pct', 'bwd_pct', 'opt_pct')) == pytest.approx(100) # the whole step
    assert col(main, 'items_s') == [h['items_s'] for h in tp] and col(main, 'mfu_pct') == [h['mfu_pct'] for h in tp]
    mem = main['memory'][-1]
    assert len(mem['per_process']) == n and mem['rss_peak_mb'] == max(r[1] for r in mem['per_process']) > 50
    assert all(r['throughput'] == tp for r in last) # gathered: every process has the same

def test_profiler_traces(run):
    "Every process chosen wrote a Chrome trace of its recorded steps, with the model's operators"
    n,_,first,_ = run
    for r,res in enumerate(first):
        assert [p.split('/')[-1] for p in res['traces']] == [f'rank{r}-step4.pt.trace.json']
        names = {e.get('name') for e in json.loads(open(res['traces'][0]).read())['traceEvents']}
        assert {'aten::addmm', 'aten::linear', 'ProfilerStep#2', 'ProfilerStep#3'} <= names

def test_plots_after_distributed_fit(run):
    "The main process draws the Recorder's losses, the throughput and lr_find's plot, from the values of the whole fit"
    n,tmp,_,last = run
    main = last[0]
    for f in ('loss.png', 'throughput.png', 'lr_find.png'): assert (tmp/'b'/f).stat().st_size > 10_000
    train,valid = main['plot_loss']
    assert train == pytest.approx(main['losses']) and valid == pytest.approx(col(main, 'valid_loss'))
    assert main['plot_throughput'] == pytest.approx([h['items_s'] for h in main['throughput']])
    assert main['plot_lr_find'] == pytest.approx(main['lr_find']['lrs'][:-5]) and len(main['lr_find']['lrs']) == 8
    assert all('plot_loss' not in r for r in last[1:]) # the other processes draw nothing

def test_without_tracker_packages():
    "Without the trackers' packages the library imports, and asking for one names what to install"
    code = ("import sys; sys.modules.update(dict.fromkeys(['tensorboard', 'tensorboardX', 'mlflow', 'wandb'], None))\n"
            "import fastxtend_accel.all\n"
            "from fastxtend_accel.test_utils import synth_learner_digits\n"
            "try: synth_learner_digits(n=64).accelerate(log_with=['tensorboard', 'wandb'])\n"
            "except ImportError as e: print(e)")
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert "No package for the tracker(s) ['tensorboard', 'wandb']: `pip install tensorboard wandb`" in res.stdout, res.stderr

def test_trackers_come_with_core(tmp_path):
    "Trackers asked for with only `fastxtend_accel.core` imported: their module comes with them, with no warning"
    code = '\n'.join(['import warnings; warnings.simplefilter("always")', 'from fastxtend_accel.core import *',
                      'from fastxtend_accel.test_utils import synth_learner_digits',
                      f'learn = synth_learner_digits(n=64).accelerate(log_with="tensorboard", project_dir={str(tmp_path)!r})',
                      'print(type(learn.trackers).__module__)'])
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.split() == ['fastxtend_accel.trackers'], res.stderr[-2000:]
    assert 'fastxtend_accel.trackers' not in res.stderr, res.stderr[-2000:] # no warning names the module to import
