"""Weight averaging where the notebook's lessons don't reach: a compiled model (no graph compiled for the average), bf16
(an fp32 average), gradients accumulated over 3 batches against batches 3 times as large, a real out-of-memory. On several
processes, DDP and FSDP2, killed and resumed on other process counts: tests/test_dcp.py (its launched fit averages too)."""
import resource, subprocess, sys, textwrap
import pytest, torch
from fastai.basics import Callback, set_seed
from fastxtend_accel.patching import compiled_graphs
from fastxtend_accel.test_utils import synth_learner_digits, synth_regression_learner
from fastxtend_accel.core import *
from fastxtend_accel.compiler import *
from fastxtend_accel.ema import EMACallback

pytestmark = pytest.mark.usefixtures('fresh_state')

class Weights(Callback):
    "The weights after each optimizer step, seen after the average's update"
    order = EMACallback.order+1
    def before_fit(self): self.seen = [[p.detach().clone() for p in self.model.parameters()]]
    def after_step(self): self.seen.append([p.detach().clone() for p in self.model.parameters()])

def by_hand(seen, decay):
    "The average of the weights after each step, one `lerp` at a time"
    avg = seen[0]
    for w in seen[1:]: avg = [torch.lerp(a, x, 1-decay) for a,x in zip(avg, w)]
    return avg

def digits(*cbs, **kwargs):
    set_seed(0)
    return synth_learner_digits(n=500, bs=64, cbs=[EMACallback(decay=0.9), *cbs], **kwargs)

def fit(learn, n_epoch=2, lr=1e-2):
    with learn.no_bar(), learn.no_logging(): learn.fit(n_epoch, lr)
    return learn

def test_compiled_matches_eager_and_compiles_nothing_for_the_average():
    eager = fit(digits())
    compiled = digits().compile(backend='aot_eager')
    fit(compiled)
    # training, then validation under no_grad (with the average swapped in, in place): what a compiled fit always compiles
    assert compiled_graphs() == 2
    # aot_eager runs eager's kernels on the traced graph: same values but for the order of a few sums (< 1e-6 here)
    for a,b in zip(compiled.ema.avg.values(), eager.ema.avg.values()): torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    fit(compiled)
    assert compiled_graphs() == 2, "a second fit, the average begun again, compiled something"

@pytest.mark.bf16
def test_bf16_keeps_an_fp32_average_of_the_fp32_weights():
    learn = fit(digits(Weights()).accelerate(mixed_precision='bf16'))
    assert {t.dtype for t in learn.ema.avg.values()} == {torch.float32}
    for a,r in zip(learn.ema.avg.values(), by_hand(learn.weights.seen, 0.9)):
        torch.testing.assert_close(a, r, atol=1e-6, rtol=0) # `_foreach_lerp_` against `lerp`: float32 rounding

def test_accumulated_over_3_batches_as_batches_3_times_larger():
    "180 items: 18 batches of 10 in 6 groups of 3, or 6 batches of 30; one update of the average per optimizer step"
    def run(bs, k):
        learn = synth_regression_learner(n=180, n_valid=30, bs=bs, cbs=EMACallback(decay=0.8)).accelerate(
            gradient_accumulation_steps=k)
        return fit(learn, 3)
    acc,big = run(10, 3),run(30, 1)
    assert acc.ema.updates == big.ema.updates == 18
    # the mean of 3 means of 10 against one mean of 30: float32 sums in another order
    for a,b in zip(acc.ema.avg.values(), big.ema.avg.values()): torch.testing.assert_close(a, b, atol=1e-5, rtol=0)

def test_no_room_for_the_average_is_a_clear_error(tmp_path):
    """A real out-of-memory (the process's address space capped: FACTS.md): with room for the model but not for its
    average, the fit stops before its first batch with what to do, and the weights are as before"""
    code = textwrap.dedent('''
        import resource, re, torch
        from torch import nn
        from fastai.basics import *
        from fastxtend_accel.ema import EMACallback
        from fastxtend_accel.test_utils import synth_learner_digits
        learn = synth_learner_digits(n=64, bs=32, hidden=4096*8, cbs=EMACallback()) # 2.4M parameters per 1,000 wide
        before = [p.detach().clone() for p in learn.model.parameters()]
        size = sum(p.numel()*4 for p in before)
        vm = int(re.search(r'VmSize:\\s+(\\d+) kB', open('/proc/self/status').read())[1])*1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + size//2, resource.RLIM_INFINITY))
        try:
            with learn.no_bar(), learn.no_logging(): learn.fit(1)
            print('NO ERROR')
        except MemoryError as e: print('ERROR', e)
        print('SAME', all(torch.equal(a, b) for a,b in zip(before, learn.model.parameters())), learn.ema.avg is None)
    ''')
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300)
    assert 'No room for the average of the weights on cpu' in res.stdout.partition('ERROR')[2], res.stdout + res.stderr[-3000:]
    assert 'SAME True True' in res.stdout
