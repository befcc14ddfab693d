"""`.accelerate()` on XLA, checked on XLA's CPU runtime (`PJRT_DEVICE=CPU`), which runs the lazy-tensor path a TPU runs.

    bash tools/xla_check.sh    # builds a venv with torch_xla outside the tree, then runs `pytest -m xla` here

Without torch_xla these tests skip and say why. Each value is compared with plain fastai on the CPU, in this process
(XLA:CPU is one more device): XLA compiles its own kernels, so float32 values differ by rounding (a few 1e-7 after
two epochs here); the tolerance is 1e-5. Resuming on XLA from an XLA checkpoint is exact.
"""
import os, re, signal, sys
import pytest, torch
from accelerate.utils import is_torch_xla_available
from fastai.basics import Callback, Tensor, tensor
from fastai.callback.all import GradientClip, SaveModelCallback

_has_xla = is_torch_xla_available() # what Accelerate sets up XLA by (False with USE_TORCH_XLA=false)
pytestmark = [pytest.mark.xla,
              pytest.mark.skipif(not _has_xla, reason='needs torch_xla: run `bash tools/xla_check.sh`')]
if _has_xla:
    os.environ.setdefault('PJRT_DEVICE', 'CPU')
    import torch_xla
    torch_xla.device() # before any backward on the CPU in this process, else XLA's backward fails (pytorch/xla#4174)

import fastxtend_accel.all # `.accelerate()`, `.compile()`, and the patches of `save`, `load` and `export`
from fastxtend_accel.checkpoint import CheckpointCallback, latest_checkpoint
from fastxtend_accel.xla import xla_compilations
from fastxtend_accel.test_utils import (synth_learner_digits, synth_lm_learner, digits_tensors, run_cmd, start_cmd,
                                       wait_for)
from conftest import SCRIPTS, REPO

TOL = 1e-5

def digits(xla, tmp_path, n=None, **kwargs):
    "The digits learner: on XLA through `.accelerate(**xla)` if `xla` is a dict, else plain fastai on the CPU"
    learn = synth_learner_digits(n=n, path=tmp_path, **kwargs)
    return learn.accelerate(**xla) if isinstance(xla, dict) else learn

def quiet(learn, f):
    with learn.no_bar(), learn.no_logging(): return f(learn)

def both(tmp_path, f, xla=None, cpu_kw=None, **kwargs):
    "`f` run on a CPU learner and on an XLA one built alike: (cpu learner, xla learner, cpu result, xla result)"
    c,x = digits(False, tmp_path, **{**kwargs, **(cpu_kw or {})}),digits(xla or {}, tmp_path, **kwargs)
    return c,x,quiet(c, f),quiet(x, f)

def maxdiff(a, b):
    return max((u.detach().cpu().float()-v.detach().cpu().float()).abs().max().item() for u,v in zip(a, b))

def close(c, x, tol=TOL):
    assert maxdiff(c.model.parameters(), x.model.parameters()) <= tol
    assert maxdiff([tensor(v) for v in c.recorder.values], [tensor(v) for v in x.recorder.values]) <= tol

def two_groups(m): return [list(m[0].parameters()), list(m[2].parameters())]

def test_fit_matches_cpu(tmp_path):
    c,x,_,_ = both(tmp_path, lambda l: l.fit(2, 1e-2))
    close(c, x)
    assert {p.device.type for p in x.model.parameters()} == {'cpu'} # back where it was: files hold no XLA tensor
    params = list(x.model.parameters())
    assert all(any(p is q for q in params) for pl in x.opt.param_lists for p in pl) # the optimizer steps the model's
    assert {v.device.type for s in x.opt.state.values() for v in s.values() if isinstance(v, Tensor)} == {'cpu'}
    quiet(x, lambda l: l.fit(1, 1e-2)); quiet(c, lambda l: l.fit(1, 1e-2)) # a second fit, from the optimizer's state
    close(c, x)

def test_language_model_keeps_its_tied_weights():
    "An `AWD_LSTM` language model: its embedding and decoder stay tied on the device, and it learns as on the CPU"
    c,x = synth_lm_learner(),synth_lm_learner().accelerate()
    for l in (c, x): quiet(l, lambda l: l.fit(3, 1e-2))
    assert x.model[0].encoder.weight is x.model[1].decoder.weight
    params = list(x.model.parameters())
    assert all(any(p is q for q in params) for pl in x.opt.param_lists for p in pl)
    # weight dropout (which `weight_p=0` breaks in fastai) draws its masks from each device's own generator: the same
    # validation loss to its noise (2.94 on XLA, 2.99 on the CPU), down from 3.35 after the first epoch
    valid = [v[1] for v in x.recorder.values]
    assert valid[-1] == pytest.approx(c.recorder.values[-1][1], abs=0.15) and valid[-1] < valid[0] - 0.2

class Compilations(Callback):
    order = 99
    def before_fit(self): self.start,self.per_epoch = xla_compilations(),[]
    def after_epoch(self): self.per_epoch.append(xla_compilations() - self.start - sum(self.per_epoch))

def test_compilations_bounded(tmp_path):
    "One compilation a graph: the first step (the optimizer state created), the next steps, validation, a ragged batch"
    learn = digits({}, tmp_path, hidden=40) # shapes no other test compiles
    cb = Compilations()
    quiet(learn, lambda l: l.fit(3, 1e-2, cbs=cb))
    assert 0 < cb.per_epoch[0] <= 7 and cb.per_epoch[1:] == [0, 0]
    # the gradients come back from the CPU without XLA's view of them: the step is compiled once more, then never again
    quiet(learn, lambda l: l.fit_one_cycle(2, 1e-2, cbs=cb))
    assert cb.per_epoch[0] <= 1 and cb.per_epoch[1] == 0
    quiet(learn, lambda l: l.fit_one_cycle(2, 1e-2, cbs=cb)) # a schedule's values are graphs' inputs, not constants...
    assert cb.per_epoch == [0, 0]
    # ...except 0 and 1, which torch_xla bakes in: fastai's weight decay `p*(1 - lr*wd)` at lr 2e-6 is `p*1.` in float32
    quiet(learn, lambda l: l.fit_one_cycle(2, 1e-3, cbs=cb))
    assert cb.per_epoch == [0, 1]
    learn = digits({}, tmp_path, hidden=40, valid_pct=0.2505, bs=75) # 1797 items: 450 to validate, 6 batches of 75...
    quiet(learn, lambda l: l.fit(2, 1e-2, cbs=cb))
    assert cb.per_epoch[0] > 0 and cb.per_epoch[1] == 0
    learn = digits({}, tmp_path, hidden=40, valid_pct=0.25, bs=75) # ...or 449: the same, but a last batch of 74
    quiet(learn, lambda l: l.fit(2, 1e-2, cbs=cb))
    assert cb.per_epoch == [2, 0] # the ragged batch costs the compilation of its forward and of its metric

def test_weight_average(tmp_path):
    """`EMACallback` on XLA: the average kept on the device and updated in each step's graph, validated with it: the
    CPU's average, to rounding; a decay warmed up at every step (a graph input, as a schedule's values) compiles nothing"""
    from fastxtend_accel.ema import EMACallback, EMAWarmupCallback
    c,x,_,_ = both(tmp_path, lambda l: l.fit(2, 1e-2), n=512, hidden=24, cbs=EMACallback(decay=0.9),
                   cpu_kw=dict(cbs=EMACallback(decay=0.9)))
    close(c, x) # the validation losses and accuracies, of the average
    assert {t.device.type for t in x.ema.avg.values()} == {'xla'}
    assert maxdiff(c.ema.avg.values(), x.ema.avg.values()) <= TOL
    with x.ema.swapped(): assert maxdiff(x.model.parameters(), c.ema.avg.values()) <= TOL # the model is back on the CPU
    per_fit = []
    for warm in (dict(start_decay=0.5, final_decay=0.9), dict(start_decay=0.7, final_decay=0.95, finish=0.8)):
        learn,cb = digits({}, tmp_path, n=512, hidden=24, cbs=EMAWarmupCallback(**warm)),Compilations()
        quiet(learn, lambda l: l.fit(2, 1e-2, cbs=cb))
        per_fit.append(cb.per_epoch)
    # the first warm-up compiles its step's graphs once (2 here); other decays, at every step, reuse them
    assert sum(per_fit[0]) <= 4 and per_fit[1] == [0, 0]

def test_eval_before_and_after_a_failed_fit(tmp_path):
    class Boom(Callback):
        def after_batch(self):
            if self.training and self.iter == 3: raise RuntimeError('boom')
    c,x = digits(False, tmp_path),digits({}, tmp_path)
    for _ in range(2): assert maxdiff(c.get_preds()[:1], x.get_preds()[:1]) <= TOL # the same prepared model twice
    with pytest.raises(RuntimeError, match='boom'): quiet(x, lambda l: l.fit(1, 1e-2, cbs=Boom()))
    with pytest.raises(RuntimeError, match='boom'): quiet(c, lambda l: l.fit(1, 1e-2, cbs=Boom()))
    assert maxdiff(c.get_preds()[:1], x.get_preds()[:1]) <= TOL
    quiet(x, lambda l: l.fit(1, 1e-2)); quiet(c, lambda l: l.fit(1, 1e-2))
    close(c, x)

def test_schedules_freezing_and_discriminative_lrs(tmp_path):
    c,x,_,_ = both(tmp_path, lambda l: l.fine_tune(2, 1e-2), splitter=two_groups)
    close(c, x)
    def frozen_then_sliced(l):
        l.freeze(); l.fit_one_cycle(1, 1e-2)
        before = [p.detach().clone() for p in l.model[0].parameters()]
        l.unfreeze(); l.fit_one_cycle(2, slice(1e-4, 1e-2))
        return before
    c,x,bc,bx = both(tmp_path, frozen_then_sliced, splitter=two_groups)
    close(c, x)
    assert maxdiff(bc, bx) == 0 # frozen: untouched on XLA too
    assert x.opt.hypers[0]['lr'] == c.opt.hypers[0]['lr'] != x.opt.hypers[1]['lr']

def test_lr_find(tmp_path):
    c,x,rc,rx = both(tmp_path, lambda l: l.lr_find(show_plot=False))
    assert maxdiff(c.model.parameters(), x.model.parameters()) == 0 # the weights from before, restored
    assert len(c.recorder.losses) == len(x.recorder.losses)
    # the search drives lr to 10 and the loss up to 4x its minimum: rounding grows there; where it decides, it agrees
    assert rx.valley == pytest.approx(rc.valley, rel=1e-3)

def test_accumulation_and_clipping(tmp_path):
    c,x,_,_ = both(tmp_path, lambda l: l.fit(2, 1e-2), xla=dict(gradient_accumulation_steps=2), bs=32,
                   cpu_kw=dict(bs=64))
    assert maxdiff(c.model.parameters(), x.model.parameters()) <= TOL # 2 batches of 32 on XLA == 1 of 64 on the CPU
    c,x,_,_ = both(tmp_path, lambda l: l.fit(2, 1e-2, cbs=GradientClip(0.1)))
    close(c, x)

def test_bf16(tmp_path):
    learn = digits(dict(mixed_precision='bf16'), tmp_path)
    seen = []
    learn.model[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    quiet(learn, lambda l: l.fit(1, 1e-2))
    quiet(learn, lambda l: l.fit(1, 1e-2)) # the second fit is autocast too (`forget_prepared`)
    assert set(seen) == {torch.bfloat16}
    assert {p.dtype for p in learn.model.parameters()} == {torch.float32}
    ref = digits({}, tmp_path)
    quiet(ref, lambda l: l.fit(2, 1e-2))
    # accuracy, to bf16's precision
    assert learn.recorder.values[-1][-1] == pytest.approx(ref.recorder.values[-1][-1], abs=0.03)

def test_evaluation(tmp_path):
    def evaluate(l):
        l.fit(1, 1e-2)
        return (l.get_preds(with_input=True, with_loss=True), l.validate(), l.predict(l.dls.valid_ds.items[0]),
                l.get_preds(dl=l.dls.test_dl(list(range(100))))[0])
    c,x,rc,rx = both(tmp_path, evaluate)
    assert maxdiff(rc[0], rx[0]) <= TOL
    assert list(rc[1]) == pytest.approx(list(rx[1]), abs=TOL)
    assert maxdiff(rc[2][1:], rx[2][1:]) <= TOL
    assert maxdiff(rc[3:], rx[3:]) <= TOL

def test_files_load_without_torch_xla(tmp_path):
    learn = digits({}, tmp_path)
    cbs = [SaveModelCallback(fname='ep', every_epoch=True), CheckpointCallback(tmp_path/'ckpt')]
    quiet(learn, lambda l: l.fit(2, 1e-2, cbs=cbs))
    learn.save('after')
    learn.export(tmp_path/'export.pkl')
    # 'ep_1' and the checkpoint were written inside the fit, from the model on XLA
    run_cmd([sys.executable, SCRIPTS/'without_xla.py', SCRIPTS/'load_files.py', learn.path/'models'/'ep_1.pth',
             tmp_path/'export.pkl', latest_checkpoint(tmp_path/'ckpt'), tmp_path], cwd=REPO)
    res = torch.load(tmp_path/'loaded.pt', weights_only=False)
    assert res['devices'] == ['cpu']
    assert torch.equal(res['preds'], learn.model(digits_tensors(20)[0]).detach())
    for sd in (res['model'], res['ckpt_model']):
        for k,v in learn.model.state_dict().items(): assert torch.equal(sd[k], v)
    other = digits({}, tmp_path)
    other.load('after')
    other.dls.train.rng.setstate(learn.dls.train.rng.getstate()) # the same shuffling from here
    quiet(other, lambda l: l.fit(1, 1e-2)); quiet(learn, lambda l: l.fit(1, 1e-2)) # the optimizer state came back too
    assert maxdiff(other.model.parameters(), learn.model.parameters()) == 0

def test_compile(tmp_path):
    c = digits(False, tmp_path, n=512)
    quiet(c, lambda l: l.fit(2, 1e-2))
    x = digits({}, tmp_path, n=512).compile() # 'openxla' on XLA
    quiet(x, lambda l: l.fit(2, 1e-2))
    close(c, x)
    n = xla_compilations()
    quiet(x, lambda l: l.fit(1, 1e-2))
    assert xla_compilations() == n
    inductor = digits({}, tmp_path, n=512).compile(backend='inductor')
    with pytest.raises(ValueError, match="backend='openxla'"): quiet(inductor, lambda l: l.fit(1))

# kill and resume, through tests/scripts/resume_train.py: a 3-epoch one-cycle fit that checkpoints every 3 steps
SCRIPT = SCRIPTS/'resume_train.py'
XLA_ENV = dict(PJRT_DEVICE=os.environ.get('PJRT_DEVICE', 'CPU'))

def train(out, *args, cpu=False, sleep=None):
    "Start (`sleep`: a process to kill) or run resume_train.py on XLA, or on the CPU in a process without torch_xla"
    cmd = [sys.executable, *([SCRIPTS/'without_xla.py'] if cpu else []), SCRIPT, out, *args]
    if sleep is not None: return start_cmd(cmd + ['--sleep', str(sleep)], env=XLA_ENV, cwd=REPO)
    run_cmd(cmd, env=XLA_ENV, cwd=REPO, timeout=600)

def final(d): return torch.load(d/'final-rank0.pt', weights_only=False)

def killed_mid_epoch(d, *args, cpu=False):
    proc = train(d, *args, cpu=cpu, sleep=0.05)
    mid_epoch = lambda: (ck := latest_checkpoint(d/'ckpt')) is not None and ck.name >= 'ckpt-e0001-b000006'
    wait_for(mid_epoch, proc, timeout=300)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (d/'final-rank0.pt').exists() and '-b000000-' not in latest_checkpoint(d/'ckpt').name

def test_sigkill_resumes_exactly_on_xla(tmp_path_factory):
    ref,d = tmp_path_factory.mktemp('ref'),tmp_path_factory.mktemp('killed')
    train(ref) # with dropout: its masks come from the XLA device's generator, which the checkpoint keeps
    killed_mid_epoch(d)
    train(d)
    res,exp = final(d),final(ref)
    for a,b in zip(res['params'], exp['params']): assert torch.equal(a, b)
    assert res['values'] == exp['values']

@pytest.mark.parametrize('first', ['xla', 'cpu'])
def test_checkpoint_moves_between_xla_and_cpu(tmp_path_factory, first):
    "Killed on one device, resumed on the other (the CPU one without torch_xla): as the uninterrupted run, to rounding"
    ref,d = tmp_path_factory.mktemp('ref'),tmp_path_factory.mktemp('moved')
    train(ref, '--dropout', '0')
    killed_mid_epoch(d, '--dropout', '0', cpu=first == 'cpu')
    train(d, '--dropout', '0', cpu=first == 'xla')
    res,exp = final(d),final(ref)
    assert maxdiff(res['params'], exp['params']) <= TOL
    assert maxdiff([tensor(v) for v in res['values']], [tensor(v) for v in exp['values']]) <= TOL

def test_refusals(tmp_path):
    with pytest.raises(ValueError, match="use mixed_precision='bf16'"): digits(dict(mixed_precision='fp16'), tmp_path)
    learn = digits({}, tmp_path, n=256)
    learn.dls.to(torch_xla.device())
    with pytest.raises(ValueError, match="Keep the loaders on the CPU"): quiet(learn, lambda l: l.fit(1))

def test_bench_xla_smoke():
    "bench/bench_xla.py with tiny sizes: every variant prints its row, and the verdict is the one its ratio gives"
    out = run_cmd([sys.executable, REPO/'bench'/'bench_xla.py', '--tiny'], cwd=REPO, timeout=600).stdout
    for v in ('Accelerate XLA loop', 'Accelerate XLA loop, loss.item() each step', 'fastxtend_accel Learner'):
        assert re.search(rf'^\| {re.escape(v)} \| \d+\.\d+ \| \d+\.\d+ \| \[\d', out, re.M), out
    m = re.search(r'<= 1\.10x: (\d+\.\d+)x -> (PASS|FAIL)$', out, re.M)
    assert m and m[2] == ('PASS' if float(m[1]) <= 1.10 else 'FAIL'), out
