"""Micro-batches (`.accelerate(micro_bs=...)`) with real out-of-memory (an address space capped with `RLIMIT_AS`): on 2
processes where only one runs short (tests/scripts/micro_scenarios.py, one launch), and killed after a back-off then
resumed (tests/scripts/micro_train.py). A fit that backed off runs the same operations on the same items as a fit with
the final micro-batch from the start: equal, bit for bit. One process: the lessons of nbs/16j_microbatch.ipynb."""
import sys
import pytest, torch
from conftest import SCRIPTS
from fastxtend_accel.test_utils import torchrun_cmd, run_cmd, run_ranks, start_cmd, wait_for, kill_group
from fastxtend_accel.checkpoint import latest_checkpoint
from fastxtend_accel.core import *
from fastxtend_accel.compiler import * # `Learner.compile`
from fastxtend_accel.patching import compiled_graphs
from fastxtend_accel.test_utils import synth_wide_learner
from fastai.optimizer import SGD

@pytest.fixture(scope='module')
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp('micro')
    return run_ranks(torchrun_cmd(2) + [SCRIPTS/'micro_scenarios.py', out], out, timeout=900)

def same_fit(a, b):
    for x,y in zip(a['params'], b['params']): assert torch.equal(x, y)
    assert (a['values'], a['losses']) == (b['values'], b['losses'])

@pytest.mark.parametrize('case', ['auto', 'cycle'])
def test_back_off_on_one_process_of_two(ranks, case):
    "Process 1 alone runs out at the first batch: both halve, the same batch again, as the fixed micro-batch would"
    for r in ranks:
        res = r[case]
        assert res['found'] < 512 and res['tried'] == [512] and res['passes'][0][0] == 512 # the failed attempt
        n = 512//res['found']
        assert res['passes'][0][1:] == [res['found']]*n and all(p == [res['found']]*n for p in res['passes'][1:])
        same_fit(res, r[f'{case}_fixed'])
    for x,y in zip(ranks[0][case]['params'], ranks[1][case]['params']): assert torch.equal(x, y) # synced gradients

def test_nothing_fits_is_a_clear_error(ranks):
    "Both processes stop with the sizes tried; the one that ran out names the allocation; no weight changed"
    for r in ranks:
        assert r['nothing'].startswith('Out of memory on process 1 even with micro-batches of 1 item (ran out with '
                                       '512, 256, 128, 64, 32, 16, 8, 4, 2, 1 of a batch of 512)')
        assert r['nothing_same']
    assert "can't allocate memory" in ranks[1]['nothing']

def test_find_micro_bs_agrees_and_puts_back(ranks):
    "The size that trains on both processes, the same on each; weights, random state and optimizer as before"
    assert ranks[0]['find'] == ranks[1]['find'] < 512
    for r in ranks: assert r['find_kept'] == (True, True, True, r['find'])

def test_validation_backs_off_alone(ranks):
    "Process 1 validates its share in parts, process 0 whole: the metrics of the whole set, unchanged"
    assert (ranks[0]['valid_found'], ranks[1]['valid_found']) == (None, 256)
    # the model on parts of the batch: float sums by another kernel blocking, to a few ulps of the loss
    for r in ranks: assert list(r['valid_short']) == pytest.approx(list(r['valid_plain']), rel=1e-6)

def test_kill_after_back_off_resumes_exactly(tmp_path):
    "Killed mid-epoch after backing off; resumed without the cap, the checkpoint's micro-batch from its first batch"
    script = SCRIPTS/'micro_train.py'
    run = tmp_path/'run'
    proc = start_cmd([sys.executable, script, run, '--limit', '190', '--sleep', '0.3'])
    def mid_epoch_1():
        ck = latest_checkpoint(run/'ckpt')
        return ck is not None and ck.name.startswith('ckpt-e0001') and '-b000000-' not in ck.name
    wait_for(mid_epoch_1, proc)
    kill_group(proc)
    assert not (run/'final.pt').exists()
    run_cmd([sys.executable, script, run])
    res = torch.load(run/'final.pt', weights_only=False)
    # halved from the whole batch (512) before the kill, kept by the checkpoint (the resumed run had room for more)
    assert res['tried'] == [512 >> k for k in range(len(res['tried']))] and res['found'] == res['tried'][-1]//2
    ref = tmp_path/'ref'
    run_cmd([sys.executable, script, ref, '--micro', str(res['found'])])
    want = torch.load(ref/'final.pt', weights_only=False)
    for a,b in zip(res['params'], want['params']): assert torch.equal(a, b)
    assert res['values'] == want['values']

def test_compiled_micro_batches():
    """Micro-batches of a compiled model: the eager fit's weights and metrics; equal parts: a graph for training (and one
    for validation), none more at the next fit"""
    def fitted(compiled):
        learn = synth_wide_learner(n=1024, width=256, opt_func=SGD).accelerate(micro_bs=128) # 3 batches of 512 a fit
        if compiled: learn.compile(backend='aot_eager')
        with learn.no_bar(), learn.no_logging(): learn.fit(1, 1e-2)
        return learn
    eager,g0 = fitted(False),compiled_graphs()
    compiled = fitted(True)
    assert compiled_graphs() - g0 == 2 # micro-batches of 128 in training; the validation's 256 items in eval mode
    for a,b in zip(eager.model.parameters(), compiled.model.parameters()): assert torch.equal(a, b)
    assert eager.recorder.values == compiled.recorder.values
    with compiled.no_bar(), compiled.no_logging(): compiled.fit(1, 1e-2)
    assert compiled_graphs() - g0 == 2
