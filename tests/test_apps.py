"""fastai's applications under the library (tabular, collab, text classifier and language model on RNNs, images; `fastxtend_accel.test_utils.app_learners`):
`.accelerate()` on 1 process (as stock fastai) and on 2 (as 1 with the same global batches), bf16, `.compile()`, evaluation on
rank 0 alone, and exact resume after a SIGKILL. The launched scenarios are tests/scripts/app_scenarios.py."""
import importlib.util, math, multiprocessing, os, signal
import pytest, torch
from fastcore.foundation import L
from fastai.torch_core import apply
from torch import nn
from fastxtend_accel.patching import compiled_graphs, clear_compiled_graphs
import fastxtend_accel.core # `Learner.accelerate`
from fastxtend_accel.compiler import is_compiled
from fastxtend_accel.checkpoint import latest_checkpoint
from fastxtend_accel.test_utils import app_learners, torchrun_cmd, run_ranks, wait_for
from conftest import SCRIPTS

SCRIPT = SCRIPTS/'app_scenarios.py'
APPS = list(app_learners)

def _import_script():
    spec = importlib.util.spec_from_file_location('app_scenarios', SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
sc = _import_script()

@pytest.fixture(scope='module', autouse=True)
def one_thread():
    "One thread, as the launched processes have: on a busy 2-core machine tiny models train ten times faster so"
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

def _close(a, b, tol=0., path=''):
    "Assert `a` and `b` (nested dicts, lists, tensors, numbers) are equal, numbers within `tol`"
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a: _close(a[k], b[k], tol, f'{path}.{k}')
    elif isinstance(a, (list, tuple, L)):
        assert len(a) == len(b), path
        for i,(x,y) in enumerate(zip(a, b)): _close(x, y, tol, f'{path}[{i}]')
    elif isinstance(a, torch.Tensor):
        assert a.shape == b.shape, path
        assert (a.double() - b.double()).abs().max().item() <= tol if tol else torch.equal(a, b), f'{path}: {(a.double()-b.double()).abs().max()}'
    else: assert abs(a - b) <= tol, f'{path}: {a} vs {b}'

def _fit(app, n_epoch=2, accelerate=True, **kwargs):
    "A fresh learner of `app`, accelerated with `kwargs` (or not), trained as the scenarios train it"
    learn = app_learners[app]()
    if accelerate: learn.accelerate(**kwargs)
    with learn.no_bar(), learn.no_logging(): learn.fit(n_epoch, sc.LRS[app])
    return learn

@pytest.fixture(scope='module')
def single(tmp_path_factory):
    "The scenarios on 1 process, in this one (batches of 32)"
    return sc.fit_apps(tmp_path_factory.mktemp('one'))

@pytest.fixture(scope='module')
def two(tmp_path_factory):
    "The scenarios on 2 processes (batches of 16 each), in one torchrun launch for all applications"
    d = tmp_path_factory.mktemp('two')
    return run_ranks(torchrun_cmd(2) + [SCRIPT, d], d, timeout=240)

@pytest.mark.parametrize('app', APPS)
def test_one_process_is_stock_fastai(app, single):
    "`.accelerate()` on 1 process trains as stock fastai does, bit for bit, and fastai's evaluation gives the same values"
    learn = _fit(app, accelerate=False)
    res = single[app]
    _close(sc.params(learn), res['params'])
    assert learn.recorder.values == res['values']
    with learn.no_bar(): _close(sc.evaluate(learn, app), {k: res[k] for k in res if k not in ('params', 'values', 'losses')})

@pytest.mark.parametrize('app', APPS)
def test_two_processes_equal_one(app, single, two):
    "Ranks identical after the fit; 2 processes of 16 equal 1 of 32; rank 0 alone evaluates and gets the 1-process values"
    r0,r1 = two[0][app],two[1][app]
    # 2 processes vs 1: the same float32 math with sums in another order (each global batch's gradient in two halves, the loss
    # averaged over processes): measured <= 6.2e-7 here (losses of ~3: a few ulps); 1e-5 leaves 16x for other kernels
    _close(r0['params'], r1['params'])
    assert r0['values'] == r1['values']
    _close(r0['params'], single[app]['params'], 1e-5)
    _close(r0['values'], single[app]['values'], 1e-5)
    _close(r0['losses'], single[app]['losses'], 1e-5) # the smooth loss averages both processes' losses
    assert 'valid' in r0 and 'valid' not in r1
    for k in ('preds', 'test_preds', 'predict', 'valid'):
        if k in single[app] and not (app == 'lm' and k == 'valid'): _close(r0[k], single[app][k], 1e-5, k)
    if app == 'lm': # its loss depends on the batch size (the stream's rows): rank 0 alone reads its own loader, 16 rows, as stock fastai does
        learn = app_learners[app](bs=16)
        for p,w in zip(learn.model.parameters(), r0['params']): p.data.copy_(w)
        with learn.no_bar(): _close(r0['valid'], list(learn.validate()), 1e-6) # the same ops and batches in another process: < 1e-8 here
    if 'targs' in r0: _close(r0['targs'], single[app]['targs']) # in dataset order, all of them

def _low_precision_outputs(learn):
    "Record the dtypes of the outputs of `learn.model`'s linear and conv layers; returns the set and the hooks"
    dtypes = set()
    hooks = [m.register_forward_hook(lambda m,i,o: dtypes.add(o.dtype)) for m in learn.model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    return dtypes,hooks

def _torch_autocast_runs(learn):
    "Whether torch's own CPU bf16 autocast runs `learn.model` here (`nn.LSTM`: only on CPUs with AVX-512), probed on one batch"
    xb = learn.dls.one_batch()[:learn.dls.n_inp]
    try:
        with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16): learn.model(*xb)
        return True
    except RuntimeError: return False
    finally:
        for m in learn.model.modules():
            if hasattr(m, 'reset'): m.reset() # an RNN keeps its hidden state from the probe otherwise

def autocast_by_hand(learn):
    "`learn` with torch's CPU bf16 autocast written by hand around its model's forward, outputs back to fp32 (as Accelerate does)"
    fwd = learn.model.forward
    def forward(*args, **kwargs):
        with torch.autocast('cpu', dtype=torch.bfloat16): out = fwd(*args, **kwargs)
        return apply(lambda t: t.float() if isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 else t, out)
    learn.model.forward = forward
    return learn

@pytest.mark.bf16
@pytest.mark.parametrize('app', APPS)
def test_bf16(app):
    """`.accelerate(mixed_precision='bf16')` trains as stock fastai with torch's autocast written by hand, bit for bit: the same
    batches, optimizer and ops, so any difference is the library's. Where torch can't autocast the model on this CPU, the library
    refuses it before training, with the fix. Run as the CPU is and with native bf16 hidden (`tools/test.sh`)."""
    if not _torch_autocast_runs(app_learners[app]()):
        learn = app_learners[app]().accelerate(mixed_precision='bf16')
        before = sc.params(learn)
        with pytest.raises(ValueError, match=r"can't run `nn.LSTM` on this CPU.*mixed_precision='no'"): learn.fit(1, sc.LRS[app])
        _close(sc.params(learn), before) # refused before the first step
        return
    ref = autocast_by_hand(app_learners[app]()) # each learner is built (seeded) right before its fit: the same batches and dropout
    with ref.no_bar(), ref.no_logging(): ref.fit(3, sc.LRS[app])
    learn = app_learners[app]().accelerate(mixed_precision='bf16')
    dtypes,hooks = _low_precision_outputs(learn)
    with learn.no_bar(), learn.no_logging(): learn.fit(3, sc.LRS[app])
    for h in hooks: h.remove()
    if hooks: assert dtypes == {torch.bfloat16} # autocast was on in the layers that have matmuls
    _close(sc.params(learn), sc.params(ref))
    assert learn.recorder.values == ref.recorder.values
    losses = [float(l) for l in learn.recorder.losses]
    assert all(math.isfinite(l) for l in losses) and losses[-1] < losses[0]

# dynamo and AOTAutograd, without inductor's code generation (minutes on CPU). The text model breaks into 15 graphs around its
# LSTM (dynamo doesn't trace RNNs) and AOTAutograd on each would take 15 s: dynamo alone for the RNNs
BACKENDS = dict(tabular='aot_eager', collab='aot_eager', text='eager', lm='eager', images='aot_eager')

@pytest.mark.parametrize('app', APPS)
def test_compile(app):
    "`.compile()` with `.accelerate()`: dynamo captures the model and the fit equals the eager one"
    eager = _fit(app)
    clear_compiled_graphs()
    learn = app_learners[app]().accelerate().compile(backend=BACKENDS[app])
    with learn.no_bar(), learn.no_logging(): learn.fit(2, sc.LRS[app])
    assert compiled_graphs() > 0
    # dynamo and AOTAutograd run the same aten ops, but may decompose some into others that sum in another order: < 1e-7 here
    _close(sc.params(learn), sc.params(eager), 1e-5)
    _close(learn.recorder.values, eager.recorder.values, 1e-5)
    assert type(learn.model) is type(eager.model) and is_compiled(learn.model)

def _fork(fn, *args):
    "Run `fn(*args)` in a child forked from this process, where everything is imported already (a launch costs 10 s of imports)"
    proc = multiprocessing.get_context('fork').Process(target=fn, args=args)
    proc.start()
    return proc

def test_resume_after_sigkill(tmp_path):
    "Each application, killed with SIGKILL mid-epoch (at or one batch after a checkpoint), resumes to the uninterrupted fit, bit for bit"
    killed_at = {}
    for app in APPS: # one process per kill: it finishes the application killed before, then stops in this one
        proc = _fork(sc.resume_apps, tmp_path)
        wait_for(lambda: (tmp_path/f'killed-{app}').exists() or not proc.is_alive())
        assert proc.is_alive(), f'{app}: the process ended (exit {proc.exitcode}) before the kill'
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        assert proc.exitcode == -signal.SIGKILL and not (tmp_path/f'final-{app}.pt').exists()
        name = latest_checkpoint(tmp_path/f'final-ck-{app}').name
        killed_at[app] = int(name[6:10]),int(name[12:18])
        assert killed_at[app][0] == 1 and 0 < killed_at[app][1] <= 4, name # mid-epoch, at most the 4 batches done at the kill
    proc = _fork(sc.resume_apps, tmp_path)
    proc.join()
    assert proc.exitcode == 0
    differ = {}
    for app in APPS:
        ref,res = [torch.load(tmp_path/f'{k}-{app}.pt', weights_only=False) for k in ('ref', 'final')]
        assert res['first'] == killed_at[app], app # it resumed: its first batch was the one after the checkpoint
        if not (all(torch.equal(a, b) for a,b in zip(res['params'], ref['params'])) and res['values'] == ref['values']):
            differ[app] = max((a-b).abs().max().item() for a,b in zip(res['params'], ref['params']))
    assert not differ, f'resumed fits that differ from the uninterrupted ones (largest weight difference): {differ}'
