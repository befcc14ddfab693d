"""Activation checkpointing (`.accelerate(activation_checkpointing=...)`) against the same fits without it: in bf16 with
accumulation, compiled, on AWD_LSTM, resumed after a kill (tests/test_checkpoint.py), on 2 processes with DDP and FSDP2,
compiled (tests/test_fsdp.py). The recomputation runs the same operations on the same random state: equal, bit for bit."""
import pytest, torch
from fastai.callback.schedule import fit_one_cycle
from fastxtend_accel.core import *
from fastxtend_accel.compiler import * # `Learner.compile`
from fastxtend_accel.activations import ActivationCheckpointing, is_checkpointed
from fastxtend_accel.patching import compiled_graphs
from fastxtend_accel.test_utils import synth_learner_digits, synth_text_learner, BlockNet, SavedBytes

def blocks_learner(compiled=False, **kwargs):
    "Digits with a `BlockNet` (residual blocks in a `ModuleList`), accelerated with `kwargs`"
    learn = synth_learner_digits(n=256, bs=32)
    torch.manual_seed(0)
    learn.model = BlockNet(d=32, n=3)
    learn.accelerate(**kwargs)
    return learn.compile(backend='aot_eager') if compiled else learn

def fitted(learn):
    "The weights, the `Recorder`'s rows and the bytes saved for backward a batch after a 2-epoch one-cycle fit"
    saved = SavedBytes()
    with learn.no_bar(), learn.no_logging(): learn.fit_one_cycle(2, 1e-2, cbs=saved)
    assert not any(is_checkpointed(m) for m in learn.model.modules()) # plain again
    return [p.detach().clone() for p in learn.model.parameters()],learn.recorder.values,saved.seen[0]

def assert_same(a, b):
    "`b` (checkpointed) trained as `a`, bit for bit, keeping less for the backward pass"
    for x,y in zip(a[0], b[0]): assert torch.equal(x, y)
    assert a[1] == b[1]
    assert 0 < b[2] < a[2], (a[2], b[2])

@pytest.mark.bf16
def test_bf16_and_accumulation():
    "Autocast to bf16 and 2 batches a step: the recomputation runs under the forward's autocast, on the same kernels"
    kw = dict(mixed_precision='bf16', gradient_accumulation_steps=2)
    assert_same(fitted(blocks_learner(**kw)), fitted(blocks_learner(activation_checkpointing=True, **kw)))

def test_compiled():
    "Compiled after checkpointing is applied: the recomputation is part of the compiled backward"
    ac = blocks_learner(compiled=True, activation_checkpointing=True)
    assert_same(fitted(blocks_learner(compiled=True)), fitted(ac))
    assert len(ac.cbs.filter(lambda c: isinstance(c, ActivationCheckpointing))[0].blocks) == 3
    g0 = compiled_graphs()
    with ac.no_bar(), ac.no_logging(): ac.fit(1, 1e-3)
    assert compiled_graphs() == g0 # the same wrappers at the next fit: nothing compiled again

def test_awd_lstm_with_dropout():
    "AWD_LSTM with dropout on its weights and activations, its LSTM layer recomputed with the same dropped weights"
    def learner(**kw): return synth_text_learner(p=0.2, weight_p=0.3).accelerate(**kw)
    assert_same(fitted(learner()), fitted(learner(activation_checkpointing=True)))
