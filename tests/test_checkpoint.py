"Exact resume after kills and preemption, on real processes (tests/scripts/resume_train.py)."
import shutil, signal, sys, warnings
import pytest, torch
from conftest import SCRIPTS
from fastxtend_accel.test_utils import (synth_learner_digits, tiny_mlp, StopAt, torchrun_cmd, run_cmd, start_cmd, wait_for,
                                        kill_group, signal_proc)
from fastai.basics import Callback
from fastxtend_accel.checkpoint import CheckpointCallback, latest_checkpoint
from fastxtend_accel.checkpoint.state import scan_checkpoints
from fastxtend_accel.checkpoint.codec import read_state_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

SCRIPT = SCRIPTS/'resume_train.py'

def mid_epoch(d, epoch=1):
    ck = latest_checkpoint(d/'ckpt')
    return ck is not None and int(ck.name[6:10]) >= epoch and not ck.name.startswith('ckpt-e0003')

def finals(d, n=1): return [torch.load(d/f'final-rank{r}.pt', weights_only=False) for r in range(n)]

@pytest.fixture(scope='module')
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp('ref')
    run_cmd([sys.executable, SCRIPT, d])
    return finals(d)[0]

@pytest.mark.matrix
def test_sigkill_mid_epoch_resumes_exactly(tmp_path, reference):
    proc = start_cmd([sys.executable, SCRIPT, tmp_path, '--sleep', '0.03'])
    wait_for(lambda: mid_epoch(tmp_path), proc)
    kill_group(proc)
    assert not (tmp_path/'final-rank0.pt').exists()
    killed_at = latest_checkpoint(tmp_path/'ckpt').name
    assert '-b000000-' not in killed_at # a mid-epoch checkpoint
    run_cmd([sys.executable, SCRIPT, tmp_path])
    res = finals(tmp_path)[0]
    for a,b in zip(res['params'], reference['params']): assert torch.equal(a, b)
    assert res['values'] == reference['values']

def test_sigkill_with_activation_checkpointing(tmp_path, reference):
    "Each Linear and Dropout recomputed (the same dropout masks), killed mid-epoch, resumed: the fit without it, exactly"
    proc = start_cmd([sys.executable, SCRIPT, tmp_path, '--sleep', '0.03', '--activations'])
    wait_for(lambda: mid_epoch(tmp_path), proc)
    kill_group(proc)
    run_cmd([sys.executable, SCRIPT, tmp_path, '--activations'])
    res = finals(tmp_path)[0]
    for a,b in zip(res['params'], reference['params']): assert torch.equal(a, b)
    assert res['values'] == reference['values']

def test_sigkill_during_checkpoint_write(tmp_path, reference):
    proc = start_cmd([sys.executable, SCRIPT, tmp_path, '--slow-save'])
    wait_for(lambda: any(p.name.startswith('.tmp-ckpt-e0001') for p in (tmp_path/'ckpt').glob('.tmp-*')), proc)
    before = latest_checkpoint(tmp_path/'ckpt')
    kill_group(proc)
    assert latest_checkpoint(tmp_path/'ckpt') == before and before.name.startswith('ckpt-e0000')
    run_cmd([sys.executable, SCRIPT, tmp_path])
    res = finals(tmp_path)[0]
    for a,b in zip(res['params'], reference['params']): assert torch.equal(a, b)
    assert res['values'] == reference['values']

@pytest.mark.bf16
@pytest.mark.matrix
def test_sigterm_two_processes(tmp_path_factory):
    "2 processes in bf16 with gradient accumulation, SIGTERM to torchrun mid-epoch, then resumed"
    ref,d = tmp_path_factory.mktemp('ref2'),tmp_path_factory.mktemp('term2')
    opts = ['--mixed-precision', 'bf16', '--accumulate', '2']
    run_cmd(torchrun_cmd(2) + [SCRIPT, ref, *opts])
    proc = start_cmd(torchrun_cmd(2) + [SCRIPT, d, '--sleep', '0.03', *opts])
    wait_for(lambda: mid_epoch(d), proc)
    signal_proc(proc, signal.SIGTERM, timeout=120) # to the launcher, which passes it on to both processes
    out = proc.stdout.read().decode()
    assert not (d/'final-rank0.pt').exists(), out[-2000:]
    ck = latest_checkpoint(d/'ckpt')
    # each process wrote its part of the tensors (DCP) and its random states; the main process the rest
    assert sorted(p.name for p in ck.iterdir()) == ['.metadata', '__0_0.distcp', '__1_0.distcp', 'manifest.json', 'rng-0.pt',
                                                   'rng-1.pt', 'state.pt']
    run_cmd(torchrun_cmd(2) + [SCRIPT, d, *opts])
    for res,exp in zip(finals(d, 2), finals(ref, 2)): # resumed vs uninterrupted, in bf16: < 1e-8 here
        for a,b in zip(res['params'], exp['params']): assert (a - b).abs().max() <= 1e-6
        assert (torch.stack(res['losses']) - torch.stack(exp['losses'])).abs().max() <= 1e-6
        assert (res['own_smooth'] - exp['own_smooth']).abs() <= 1e-6 # each process's smoothing went on from its own value

def test_resume_compiled(tmp_path):
    "A compiled learner resumes mid-epoch exactly too"
    from fastai.basics import set_seed
    from fastai.callback.schedule import fit_one_cycle
    import fastxtend_accel.compiler
    def fit(cbs):
        set_seed(0)
        learn = synth_learner_digits(n=512, bs=32).compile(backend='aot_eager')
        with learn.no_bar(), learn.no_logging(): learn.fit_one_cycle(2, 1e-2, cbs=cbs)
        return learn
    ref = fit([])
    fit([CheckpointCallback(tmp_path, every_steps=3), StopAt(1, 5)])
    assert latest_checkpoint(tmp_path).name == 'ckpt-e0001-b000006-f000'
    res = fit([CheckpointCallback(tmp_path, every_steps=3, resume=True)])
    for a,b in zip(ref.model.parameters(), res.model.parameters()): assert torch.equal(a, b)
    assert res.recorder.values == ref.recorder.values

def _learner():
    from fastai.basics import set_seed
    set_seed(0)
    learn = synth_learner_digits(n=512, bs=32)
    learn.model = tiny_mlp(p=0.3)
    return learn

def _same(a, b):
    assert all(torch.equal(x, y) for x,y in zip(a.model.parameters(), b.model.parameters()))
    assert a.recorder.values == b.recorder.values

def test_resume_twice_with_trackers(tmp_path):
    "Killed twice (the second time after resuming), with SaveModelCallback: still exact, and skipped epochs leave no trace"
    from fastai.callback.tracker import SaveModelCallback
    from fastai.callback.schedule import fit_one_cycle
    def fit(*cbs):
        learn = _learner()
        learn.path = tmp_path
        with learn.no_bar(), learn.no_logging(): learn.fit_one_cycle(4, 1e-2, cbs=[SaveModelCallback(), *cbs])
        return learn
    ref = fit()
    fit(CheckpointCallback(tmp_path/'ck', every_steps=5), StopAt(2, 3))
    first = latest_checkpoint(tmp_path/'ck')
    fit(CheckpointCallback(tmp_path/'ck', every_steps=5, resume=True), StopAt(2, 9))
    assert first.exists() and latest_checkpoint(tmp_path/'ck').name == 'ckpt-e0002-b000006-f000'
    _same(fit(CheckpointCallback(tmp_path/'ck', every_steps=5, resume=True)), ref)

def test_resume_at_fit_boundary(tmp_path):
    "A checkpoint at the end of a fit: the next fit starts with the random states it had"
    def run(*cbs):
        learn = _learner()
        with learn.no_bar(), learn.no_logging():
            learn.fit(1, 1e-2, cbs=list(cbs))
            learn.fit(2, 1e-2, cbs=list(cbs))
        return learn
    ref = run()
    cb = CheckpointCallback(tmp_path, every_epochs=1)
    run(cb, StopAt(0, 3, fit=1)) # in the second fit
    assert latest_checkpoint(tmp_path).name == 'ckpt-e0001-b000000-f000'
    _same(run(CheckpointCallback(tmp_path, every_epochs=1, resume=True)), ref)

class FailAtBatch1(Callback):
    def after_batch(self):
        if self.training and self.iter == 1: raise RuntimeError('a bug in a callback')

@pytest.fixture
def failed_fit(tmp_path):
    "A learner and its `CheckpointCallback` after a fit that raised, with Python's own SIGINT handler before it"
    # Python's own to start with: a failed fit of an earlier test may have left its handlers, which pass it on too
    kept = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        learn = synth_learner_digits(n=256)
        cb = CheckpointCallback(tmp_path, every_epochs=None)
        with learn.no_bar(), learn.no_logging(), pytest.raises(RuntimeError, match='a bug in a callback'):
            learn.fit(1, cbs=[cb, FailAtBatch1()])
        yield learn,cb
    finally: signal.signal(signal.SIGINT, kept)

def test_a_signal_after_a_failed_fit_goes_to_the_handler_before(failed_fit):
    "A fit that raised keeps its handlers: the first SIGINT after it removes them and reaches Python's (KeyboardInterrupt)"
    learn,cb = failed_fit
    assert signal.getsignal(signal.SIGINT) == cb.signals.handler and not learn.in_fit
    with pytest.raises(KeyboardInterrupt): signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and cb.signals.old_handlers == {}

def test_a_fit_after_a_failed_one_gives_the_handlers_back(failed_fit):
    "A fit that raised, then one that ends, with the same callback: Python's own handler is back, and Ctrl-C interrupts"
    learn,cb = failed_fit
    with learn.no_bar(), learn.no_logging(): learn.fit(1, cbs=cb)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt): signal.raise_signal(signal.SIGINT)

def test_evaluation_is_not_a_fit(tmp_path):
    import signal
    from fastai.callback.schedule import lr_find
    learn = synth_learner_digits(n=256, cbs=CheckpointCallback(tmp_path, every_epochs=1))
    handler = signal.getsignal(signal.SIGINT)
    learn.validate(); learn.get_preds()
    with learn.no_logging(): learn.lr_find(show_plot=False, num_it=6)
    assert not list(tmp_path.glob('ckpt-*')) and signal.getsignal(signal.SIGINT) is handler
    with learn.no_bar(), learn.no_logging(): learn.fit(1)
    assert [p.name for p in tmp_path.glob('ckpt-*')] == ['ckpt-e0001-b000000-f000']

def test_torch_dataloader_refusal_names_the_loader():
    "The refusal of `every_steps` on a torch `DataLoader` (its lesson: nbs/16_checkpoint.ipynb) says which loader it got"
    from torch.utils.data import DataLoader as TorchDL
    from fastai.data.core import DataLoaders
    learn = synth_learner_digits(n=256)
    learn.dls = DataLoaders(TorchDL(learn.dls.train.dataset, batch_size=32), TorchDL(learn.dls.valid.dataset, batch_size=32))
    with pytest.raises(ValueError, match=r'this one is a torch\.utils\.data\.dataloader\.DataLoader'):
        learn.fit(1, cbs=CheckpointCallback(every_steps=2))

def test_resume_after_last_batch_with_workers(tmp_path):
    "A checkpoint after an epoch's last batch (before validation), with worker processes loading the data"
    def fit(*cbs):
        learn = _learner()
        assert learn.dls.train.num_workers > 0
        with learn.no_bar(), learn.no_logging(): learn.fit_one_cycle(3, 1e-2, cbs=list(cbs))
        return learn
    ref = fit()
    fit(CheckpointCallback(tmp_path, every_steps=4, every_epochs=None), StopAt(1, 11))
    assert latest_checkpoint(tmp_path).name == 'ckpt-e0001-b000012-f000'
    _same(fit(CheckpointCallback(tmp_path, every_steps=4, every_epochs=None, resume=True)), ref)

# fastai's `GradientAccumulation` over epoch ends: 80 items a step; an epoch has 608 (38 batches of 16, or 19 of 2x16)
GROUP_OPTS = ['--fastai-accumulate', '80', '--every-steps', '0', '--every-epochs', '1']

def _group_count(ck): return read_state_file(ck/'state.pt')['cbs']['gradient_accumulation']['count']

def _without_last(src, dst):
    "Copy the checkpoints of `src` to `dst` but the fit's last: the run then resumes from the one before"
    shutil.copytree(src/'ckpt', dst/'ckpt', ignore=lambda d, names: [n for n in names if n.startswith('ckpt-e0003')])

def test_sigkill_after_an_epoch_ending_inside_an_accumulation_group(tmp_path_factory):
    "Checkpoints at epoch ends inside a group (its count and gradients kept), killed, resumed: the fit never killed"
    ref,d = tmp_path_factory.mktemp('group-ref'),tmp_path_factory.mktemp('group-kill')
    run_cmd([sys.executable, SCRIPT, ref, *GROUP_OPTS])
    proc = start_cmd([sys.executable, SCRIPT, d, '--sleep', '0.03', *GROUP_OPTS])
    wait_for(lambda: mid_epoch(d), proc)
    kill_group(proc)
    assert not (d/'final-rank0.pt').exists()
    ck = latest_checkpoint(d/'ckpt')
    assert '-b000000-' in ck.name and _group_count(ck) in (48, 16) # after epoch 0 or 1: items counted, not stepped on
    run_cmd([sys.executable, SCRIPT, d, *GROUP_OPTS])
    res,exp = finals(d)[0],finals(ref)[0]
    for a,b in zip(res['params'], exp['params']): assert torch.equal(a, b)
    assert res['values'] == exp['values']

def test_accumulation_group_two_processes(tmp_path):
    "DDP: each process's own gradients of the open group; resumed on 2 processes exactly, loaded on 1 as their mean"
    ref,d = tmp_path/'ref',tmp_path/'res'
    run_cmd(torchrun_cmd(2) + [SCRIPT, ref, *GROUP_OPTS])
    ck = ref/'ckpt'/'ckpt-e0002-b000000-f000'
    assert _group_count(ck) == 64 # 2 batches of 2x16 counted at the end of epoch 1
    _without_last(ref, d)
    run_cmd(torchrun_cmd(2) + [SCRIPT, d, *GROUP_OPTS])
    for res,exp in zip(finals(d, 2), finals(ref, 2)):
        for a,b in zip(res['params'], exp['params']): assert torch.equal(a, b)
        assert res['values'] == exp['values']
    dcp_to_torch_save(ck, tmp_path/'whole.pt')
    saved = torch.load(tmp_path/'whole.pt', weights_only=True)['grads']
    assert not torch.equal(saved['0.0.weight'], saved['1.0.weight']) # DDP sums a group on each process alone
    learn = _learner()
    with pytest.warns(UserWarning, match='callbacks this learner lacks'): learn.load_state(ck)
    for n,p in learn.model.named_parameters(): assert torch.equal(p.grad, (saved[f'0.{n}'] + saved[f'1.{n}'])/2)

def test_fsdp2_checkpoints_after_the_group(tmp_path):
    "FSDP2 sums a group's gradients out of a checkpoint's reach: an epoch ending inside one checkpoints after its step"
    ref,d = tmp_path/'ref',tmp_path/'res'
    opts = [*GROUP_OPTS, '--fsdp']
    out = run_cmd(torchrun_cmd(2) + [SCRIPT, ref, *opts], env=dict(PYTHONWARNINGS='default'))
    assert "checkpointing after the group's optimizer step instead" in out.stdout + out.stderr
    assert [p.name for p in scan_checkpoints(ref/'ckpt')[0]] == ['ckpt-e0002-b000001-f000', 'ckpt-e0003-b000000-f000']
    _without_last(ref, d)
    run_cmd(torchrun_cmd(2) + [SCRIPT, d, *opts])
    for res,exp in zip(finals(d, 2), finals(ref, 2)):
        for a,b in zip(res['params'], exp['params']): assert torch.equal(a.to_local(), b.to_local()) # each its shard
        assert res['values'] == exp['values']

def _accumulating(*cbs):
    "The dropout learner with fastai's `GradientAccumulation(n_acc=160)`: 12 batches of 32 an epoch, 5 to a group"
    from fastai.callback.training import GradientAccumulation
    from fastai.callback.schedule import fit_one_cycle
    learn = _learner()
    with learn.no_bar(), learn.no_logging(): learn.fit_one_cycle(3, 1e-2, cbs=[GradientAccumulation(n_acc=160), *cbs])
    return learn

def test_plain_learner_checkpoints_after_accumulated_steps(tmp_path):
    "Not accelerated: `every_steps` counts the steps `GradientAccumulation` takes; resumed after one, or inside a group"
    ref = _accumulating()
    _accumulating(CheckpointCallback(tmp_path, every_steps=1, keep=9), StopAt(1, 6))
    # epoch 0 steps after its batches 5 and 10 and ends with 2 counted; epoch 1 steps after its batches 3 and 8
    assert [p.name for p in scan_checkpoints(tmp_path)[0]] == [
        'ckpt-e0000-b000005-f000', 'ckpt-e0000-b000010-f000', 'ckpt-e0001-b000000-f000', 'ckpt-e0001-b000003-f000']
    assert _group_count(tmp_path/'ckpt-e0001-b000000-f000') == 64
    _same(_accumulating(CheckpointCallback(tmp_path, every_steps=1, resume=True)), ref)
    for p in scan_checkpoints(tmp_path)[0][3:]: shutil.rmtree(p) # from the end of epoch 0, inside a group
    _same(_accumulating(CheckpointCallback(tmp_path, every_steps=1, resume=True)), ref)

def test_failure_inside_an_accumulation_group(tmp_path):
    "`on_exception` checkpoints where the last step left the fit; not after a batch it did not step on"
    class Fail(Callback):
        order = CheckpointCallback.order+1
        def __init__(self, it, event): self.it,self.event = it,event
        def _fail(self, event):
            if event == self.event and self.training and (self.epoch, self.iter) == (1, self.it):
                raise RuntimeError('bad batch')
        def before_batch(self): self._fail('before_batch')
        def after_batch(self): self._fail('after_batch')
    def failing(d, *cbs):
        with pytest.raises(RuntimeError, match='bad batch'), warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter('always')
            _accumulating(CheckpointCallback(d, every_epochs=None, on_exception=True), *cbs)
        return [str(w.message) for w in ws if 'CheckpointCallback' in str(w.message)]
    ref = _accumulating()
    warned = failing(tmp_path/'after', Fail(4, 'after_batch'))
    assert warned[0].endswith('after a batch it did not step on: no checkpoint of this failure')
    assert scan_checkpoints(tmp_path/'after')[0] == []
    warned = failing(tmp_path/'first', Fail(0, 'before_batch'))
    assert warned[0].endswith('inside an accumulation group begun in the epoch before: no checkpoint of this failure')
    assert failing(tmp_path/'before', Fail(3, 'before_batch')) == [] # the batch after a step: nothing done since
    assert [p.name for p in scan_checkpoints(tmp_path/'before')[0]] == ['ckpt-e0001-b000003-f000']
    assert _group_count(tmp_path/'before'/'ckpt-e0001-b000003-f000') == 0
    _same(_accumulating(CheckpointCallback(tmp_path/'before', every_epochs=None, on_exception=True, resume=True)), ref)
