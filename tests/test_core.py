"fastxtend_accel.core on real processes: 2-process gloo runs against 1-process runs fed the same global batches."
import sys
import pytest, torch
from fastai.learner import load_learner
from fastxtend_accel.test_utils import (synth_learner_digits, synth_regression_learner, torchrun_cmd, accelerate_launch_cmd,
                                        run_cmd, run_ranks, free_port)
import fastxtend_accel.core # `.accelerate()`
from conftest import SCRIPTS, REPO

@pytest.fixture(scope='module')
def scenarios(tmp_path_factory):
    "Run tests/scripts/ddp_scenarios.py on 1 process (bs 32) and on 2 (bs 16 each)"
    one,two = tmp_path_factory.mktemp('one'),tmp_path_factory.mktemp('two')
    run_cmd([sys.executable, SCRIPTS/'ddp_scenarios.py', one])
    return torch.load(one/'rank0.pt', weights_only=False), run_ranks(torchrun_cmd(2) + [SCRIPTS/'ddp_scenarios.py', two], two), two

def _maxdiff(a, b): return max((x-y).abs().max().item() for x,y in zip(a, b))

# Tolerances below, unless a line says otherwise: 2 processes vs 1 (or k accumulated batches vs one k times larger) run the same
# float32 math with sums in another order; measured <= 2.4e-7 (a few ulps of the ~3 losses), with AVX-512 and AVX2 kernels alike

def test_ddp_matches_single_process(scenarios):
    single,(r0,r1),_ = scenarios
    for a,b in zip(r0['plain']['params'], r1['plain']['params']): assert torch.equal(a, b)
    assert _maxdiff(r0['plain']['params'], single['plain']['params']) < 1e-5
    assert r0['plain']['model_type'] == 'Sequential' # the user's module again after fit
    # rank r takes the r-th 16-item slice of each 32-item global batch
    assert r0['plain']['items'][0] == list(range(16)) and r1['plain']['items'][0] == list(range(16, 32))
    assert r0['plain']['losses'] == pytest.approx(single['plain']['losses'], abs=1e-4) # smooth loss: mean over processes

def test_non_finite_loss_on_one_process_skipped_everywhere(scenarios):
    "Item 50 gives an infinite loss on process 1 alone: both processes skip global batch 1's step, as a run that cancels it"
    single,(r0,r1),_ = scenarios
    for r in (single, r0, r1):
        g = r['guard']
        assert [(s['epoch'], s['batches']) for s in g['skipped']] == [(0, [1])] and 50 in g['skipped'][0]['items'][0]
        for a,b in zip(g['params'], g['cancelled']): assert torch.equal(a, b)
        assert all(p.isfinite().all() for p in g['params'])
    assert g['skipped'][0]['items'][0] == list(range(32, 64)) # the global batch, named the same on every process
    assert _maxdiff(r0['guard']['params'], single['guard']['params']) < 1e-5

def test_timed_checkpoints_agreed_across_processes(scenarios):
    "`every_minutes=2`, process 1's clock 100 s a step, process 0's 1 s: both checkpoint together, when process 1's says so"
    single,(r0,r1),_ = scenarios
    assert r0['timed'] == r1['timed'] == [f'ckpt-e0000-b00000{i}-f000' for i in (2, 4, 6)]
    assert single['timed'] == [] # one process, whose clock says 12 s in all

def test_best_checkpoint_and_failed_fit(scenarios):
    """`monitor='valid_loss'`, `keep=1`, `keep_best=1` over the epochs before a failure in epoch 1: the scores are the
    Recorder's gathered values, the best is kept beside the newest; the failure, the same on every process, is
    checkpointed after batch 2's step on 2 processes as on 1, and a fit resumed from it ends as one that never failed"""
    single,(r0,r1),_ = scenarios
    for r in (single, r0, r1):
        b = r['best']
        assert list(b['scores'].values()) == b['values'][:1] # epoch 0's, gathered on 2 processes
        assert b['best'] == 'ckpt-e0001-b000000-f000'
        assert b['kept'] == ['ckpt-e0001-b000000-f000', 'ckpt-e0001-b000003-f000'] and b['warned'] == []
        # the same operations in the same order: the resumed fit's weights are the whole fit's, bit for bit
        for a,w in zip(r['failed_resumed']['resumed'], r['failed_resumed']['whole']): assert torch.equal(a, w)
    assert abs(r0['best']['values'][0] - single['best']['values'][0]) < 1e-5

def test_failure_not_alike_everywhere_not_checkpointed(scenarios):
    """Process 0 fails inside batch 2's step and process 1 after it; or process 1 fails 3 s after process 0, which waits
    for it 1 s: no checkpoint, and every process says why. On one process each is a failure like any other"""
    single,(r0,r1),_ = scenarios
    assert single['failed_apart']['kept'] == []
    assert single['failed_apart']['warned'][0].endswith('inside an optimizer step: no checkpoint of this failure')
    assert single['failed_late'] == dict(kept=['ckpt-e0001-b000003-f000'], warned=[])
    for r in (r0, r1):
        assert r['failed_apart']['kept'] == r['failed_late']['kept'] == []
        assert ('at different batches on different processes (epoch 1, batch 2 (inside its step), epoch 1, batch 3)'
                in r['failed_apart']['warned'][0])
        assert 'on some processes only, or not within 1 s of each other' in r['failed_late']['warned'][0]

def test_batches_kept_in_place(scenarios):
    "A batch already where it goes is not copied: the loaders and `_set_device` use `cpu`, not Accelerate's `cpu:0`"
    single,(r0,r1),_ = scenarios
    for r in (single, r0, r1): assert r['plain']['kept'] == [[True, True]]*12
    assert r0['plain']['devices'] == r1['plain']['devices'] == {'cpu'}

def test_smooth_loss_without_collectives(scenarios):
    "Each process smooths its own losses, with no collective per batch; after each epoch the values are the mean over processes"
    single,(r0,r1),_ = scenarios
    one,(a,b) = single['smooth_every_False'],(r0['smooth_every_False'],r1['smooth_every_False'])
    assert a['calls'] == b['calls'] == [0]*12 # only DDP's gradient all-reduce (not called from Python) in a training batch
    assert max(abs(x-y) for x,y in zip(a['seen'], b['seen'])) > 1e-3 # during the epoch: each process's own (they differ by ~0.1)
    for r in (a, b):
        assert r['losses'] == pytest.approx(one['losses'], abs=1e-5) # after it: the mean, as one process has it
        assert r['train_loss'] == pytest.approx(one['train_loss'], abs=1e-5) and r['smooth'] == pytest.approx(one['smooth'], abs=1e-5)
    assert a['losses'] == b['losses'] and a['train_loss'] == b['train_loss']

def test_smooth_loss_every_batch(scenarios):
    "`smooth_loss_every_batch=True`: the mean over processes at every batch, for one all-reduce each"
    single,(r0,r1),_ = scenarios
    one,(a,b) = single['smooth_every_True'],(r0['smooth_every_True'],r1['smooth_every_True'])
    assert a['calls'] == b['calls'] == [1]*12
    assert a['seen'] == b['seen'] and a['seen'] == pytest.approx(one['seen'], abs=1e-5)
    assert a['losses'] == pytest.approx(r0['smooth_every_False']['losses'], abs=1e-6) # a mean every batch or once: < 1e-8 here

def test_backward_and_allreduce_counts(scenarios):
    single,(r0,r1),_ = scenarios
    assert (r0['plain']['backwards'], r0['plain']['steps'], r0['plain']['allreduces']) == (12, 12, 12)
    acc = r0['accum']
    assert (acc['backwards'], acc['steps'], acc['allreduces'], acc['clips']) == (6, 3, 3, 3)
    assert _maxdiff(acc['params'], r0['accum_ref']['params']) < 1e-5 # k=2 at bs=16 == k=1 at bs=32
    assert _maxdiff(acc['params'], single['accum']['params']) < 1e-5
    # fastai's `GradientAccumulation(n_acc=64)`: the same steps, DDP's gradients synced once a step
    for r in (single, r0, r1):
        fa = r['fastai_accum']
        assert (fa['backwards'], fa['steps']) == (6, 3) and _maxdiff(fa['params'], single['accum']['params']) < 1e-5
    assert r0['fastai_accum']['allreduces'] == 3

def test_one_cycle_and_freeze(scenarios):
    single,(r0,r1),_ = scenarios
    oc = r0['one_cycle']
    assert len(oc['lrs']) == 12 and oc['lrs'] == single['one_cycle']['lrs']
    for a,b in zip(oc['before'][:2], oc['params'][:2]): assert torch.equal(a, b) # frozen group unchanged
    for a,b in zip(oc['before'][2:], oc['params'][2:]): assert not torch.equal(a, b) # the head trained
    for a,b in zip(oc['params'], r1['one_cycle']['params']): assert torch.equal(a, b)

def test_shuffled_shards(scenarios):
    _,(r0,r1),_ = scenarios
    for key,n_batches in (('one_cycle', 6), ('torch_dl', 3)):
        e0,e1 = r0[key]['items'],r1[key]['items']
        epochs = [(sum(e0[i*n_batches:(i+1)*n_batches], []), sum(e1[i*n_batches:(i+1)*n_batches], [])) for i in range(2)]
        for a,b in epochs:
            assert not set(a) & set(b), f'{key}: processes saw the same items'
            assert len(set(a) | set(b)) == len(a) + len(b)
        assert epochs[0][0] != epochs[1][0], f'{key}: same order in both epochs'

@pytest.mark.bf16
def test_bf16_on_cpu(scenarios):
    _,(r0,r1),_ = scenarios
    for r in (r0, r1): assert r['bf16'] == dict(dtypes={'torch.bfloat16'}, loss_dtype='torch.float32')

def test_save_and_export(scenarios):
    _,(r0,r1),d = scenarios
    files = list((d/'models').iterdir())
    assert [f.name for f in files] == ['model.pth']
    sd = torch.load(files[0], weights_only=False)['model']
    assert not any(k.startswith('module.') for k in sd)
    learn = synth_regression_learner(seed=1)
    learn.load(d/'models'/'model', with_opt=False)
    for a,b in zip(learn.model.parameters(), r0['save']['params']): assert torch.equal(a, b)
    exported = load_learner(d/'export.pkl')
    assert exported.accelerator is None and not any(type(cb).__name__ == 'AcceleratorCallback' for cb in exported.cbs)
    x = torch.linspace(-1, 1, 40).view(5, 8)
    assert torch.equal(exported.model(x), r0['save']['preds'])

def test_collectives(scenarios):
    _,(r0,r1),_ = scenarios
    c0,c1 = r0['collectives'],r1['collectives']
    assert c0['gather'] == c1['gather'] == [0, 0, 1, 1]
    assert c0['all_gather'] == [[0.], [1.]]
    assert c0['reduce_mean'] == 0.5 and c1['reduce_max'] == 1.
    assert c0['broadcast'] == c1['broadcast'] == {'from': 1} and c0['broadcast_t'] == [10.]
    assert (c0['is_main'], c1['is_main']) == (True, False)
    assert (c0['grad'], c1['grad']) == ([2., 2.], [4., 4.]) # sync_grads: gradients flow back to every process

def _check_launch(cmd, d, n):
    "Run `cmd`, which launches tests/scripts/launch_check.py on `n` processes writing to `d`: they train the same weights"
    res = run_ranks(cmd, d, n)
    assert [r['world'] for r in res] == [n]*n
    for r in res[1:]:
        for a,b in zip(res[0]['params'], r['params']): assert torch.equal(a, b)
    return res

def test_torchrun(tmp_path):
    assert _check_launch(torchrun_cmd(2) + [SCRIPTS/'launch_check.py', tmp_path], tmp_path, 2)[0]['backend'] == 'gloo'

def test_accelerate_launch_multi_gpu_on_cpu(tmp_path):
    cmd = accelerate_launch_cmd('--multi_gpu', '--num_processes', '2', '--num_machines', '1', '--mixed_precision', 'no',
                                '--dynamo_backend', 'no')
    _check_launch(cmd + [SCRIPTS/'launch_check.py', tmp_path], tmp_path, 2)

def test_accelerate_launch_single(tmp_path):
    cmd = accelerate_launch_cmd('--num_processes', '1', '--num_machines', '1', '--mixed_precision', 'no', '--dynamo_backend', 'no')
    _check_launch(cmd + [SCRIPTS/'launch_check.py', tmp_path], tmp_path, 1)

@pytest.mark.parametrize('launcher', ['notebook_launcher', 'debug_launcher'])
def test_notebook_launchers(tmp_path, launcher):
    kw = 'num_processes=2' + (', use_port="%d"' % free_port() if launcher == 'notebook_launcher' else '')
    code = (f"import sys; sys.path.insert(0, {str(SCRIPTS)!r}); from launch_check import main; "
            f"from accelerate import {launcher}; {launcher}(main, ({str(tmp_path)!r},), {kw})")
    _check_launch([sys.executable, '-c', code], tmp_path, 2)

def test_demo_reaches_90_percent():
    res = run_cmd(torchrun_cmd(2) + [REPO/'examples'/'train.py', '--epochs', '5'], timeout=600, cwd=REPO)
    acc = float(res.stdout.strip().splitlines()[-1].split()[-1])
    assert acc >= 0.9, res.stdout[-2000:]

def test_stock_fastai_unchanged(tmp_path):
    "Without `.accelerate()`/`.compile()` a fit gives exactly stock fastai's values, with every module imported (and core reloaded)"
    code = """
import sys, torch
from fastai.basics import *
from fastai.callback.all import *
from sklearn.datasets import load_digits
if sys.argv[1] == 'patched':
    import importlib, fastxtend_accel.core as core
    from fastxtend_accel.all import *
    importlib.reload(core)
    assert Learner._backward.__module__ == Learner.fit.__module__ == 'fastai.learner'
x,y = load_digits(return_X_y=True)
x,y = torch.tensor(x[:512], dtype=torch.float32)/16, torch.tensor(y[:512])
dsets = Datasets(range_of(x), [[x.__getitem__], [y.__getitem__]], splits=RandomSplitter(seed=0)(range_of(x)))
set_seed(0)
model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
learn = Learner(dsets.dataloaders(bs=32, num_workers=0), model, loss_func=nn.CrossEntropyLoss(), metrics=accuracy,
                splitter=lambda m: [list(m[0].parameters()), list(m[2].parameters())], cbs=GradientAccumulation(n_acc=64))
learn.fit_one_cycle(2, 1e-2, cbs=GradientClip(0.5))
learn.fine_tune(1)
res = dict(values=learn.recorder.values, losses=learn.recorder.losses)
res['preds'] = learn.get_preds()[0]
torch.save(res, sys.argv[2])
"""
    for mode in ('stock', 'patched'): run_cmd([sys.executable, '-c', code, mode, tmp_path/f'{mode}.pt'])
    stock,patched = [torch.load(tmp_path/f'{m}.pt', weights_only=False) for m in ('stock', 'patched')]
    assert stock['values'] == patched['values']
    assert torch.equal(torch.stack(stock['losses']), torch.stack(patched['losses']))
    assert torch.equal(stock['preds'], patched['preds'])

def test_validate_inside_accelerated_fit():
    "A callback that validates inside a fit: the fit goes on prepared, and the learner is restored afterwards"
    from fastai.callback.core import Callback
    class ValidateEachEpoch(Callback):
        order,busy = 90,False
        def after_epoch(self):
            if self.busy: return # the nested validate's own after_epoch
            self.busy = True
            self.res = self.learn.validate()
            self.busy = False
    learn = synth_learner_digits(n=256).accelerate()
    v = ValidateEachEpoch()
    with learn.no_bar(): learn.fit(2, 1e-2, cbs=v)
    assert list(v.res) == pytest.approx(list(learn.validate()), rel=1e-4) # validated with the final weights: < 1e-6 apart here
    assert learn.logger is print and learn.accelerator.old_loaders is None and learn.accelerator.depth == 0

def test_failed_fit_restores_learner():
    from fastai.callback.core import Callback
    class Boom(Callback):
        def after_batch(self): raise RuntimeError('boom')
    learn = synth_learner_digits(n=256).accelerate()
    loaders = list(learn.dls.loaders)
    with pytest.raises(RuntimeError, match='boom'): learn.fit(1, cbs=Boom())
    assert learn.dls.loaders == loaders and learn.accelerator.old_loaders is None and learn.accelerator.depth == 0
    learn.fit(1) # and trains again

def test_main_process_only_work(scenarios):
    "predict, get_preds, validate, export and a callback's own batch on rank 0 alone, during and after a 2-process fit"
    single,(r0,r1),d = scenarios
    assert 'rank0' not in r1
    a,b = r0['rank0'],single['rank0']
    assert _maxdiff(a['params'], b['params']) < 1e-5
    assert (a['shapes'], b['shapes']) == ([(16, 10)]*2, [(32, 10)]*2) # one valid batch of the per-process size, each epoch
    assert a['preds'].shape == b['preds'].shape and (a['preds'] - b['preds']).abs().max() < 1e-5
    assert torch.equal(a['targs'], b['targs']) and a['targ_type'] == b['targ_type']
    assert a['predict'][0] == b['predict'][0] and (a['predict'][1] - b['predict'][1]).abs().max() < 1e-5
    assert a['valid'] == pytest.approx(b['valid'], abs=1e-5)
    assert (d/'datablock.pkl').exists()
