"Exact evaluation under 2 processes: the same numbers as 1 process, on every rank (tests/scripts/eval_scenarios.py)."
import sys
import pytest, torch
from fastxtend_accel.test_utils import torchrun_cmd, run_cmd, run_ranks
from conftest import SCRIPTS

@pytest.fixture(scope='module')
def evals(tmp_path_factory):
    one,two = tmp_path_factory.mktemp('one'),tmp_path_factory.mktemp('two')
    run_cmd([sys.executable, SCRIPTS/'eval_scenarios.py', one])
    return torch.load(one/'rank0.pt', weights_only=False), run_ranks(torchrun_cmd(2) + [SCRIPTS/'eval_scenarios.py', two], two)

def test_validation_metrics_exact(evals):
    "203 items, bs 64: valid loss, mae (AvgMetric), rmse (AccumMetric) and accuracy as on one process"
    single,ranks = evals
    for r in ranks: # per-process sums all-reduced vs one process's: sums in another order, < 1e-8 here
        assert r['regression'] == pytest.approx(single['regression'], abs=1e-6)
        assert r['regression_torch_dl'] == pytest.approx(single['regression'], abs=1e-6)
        assert r['classification'] == pytest.approx(single['classification'], abs=1e-6)

def test_get_preds_in_order(evals):
    single,ranks = evals
    for r in ranks:
        assert r['odd_tail']['values'] == pytest.approx(single['odd_tail']['values'], abs=1e-6)
    for key in ('regression_preds', 'classification_preds', 'odd_tail'):
        for r in ranks:
            for name,t in r[key].items():
                if name == 'values': continue
                assert t.shape == single[key][name].shape, (key, name)
                assert (t.float() - single[key][name].float()).abs().max() <= 1e-6, (key, name)

def test_lr_find(evals):
    _,(r0,r1) = evals
    assert r0['lr_find']['valley'] == r1['lr_find']['valley']
    for r in (r0, r1): assert r['lr_find']['restored'] and r['lr_find']['opt_restored']

def test_early_stopping_same_epoch(evals):
    single,(r0,r1) = evals
    assert r0['early_stop'] == r1['early_stop'] == single['early_stop']
    assert r0['early_stop']['epochs'] == 3 # stopped after 2 epochs without improvement

def test_activation_stats_global_batch(evals):
    single,(r0,r1) = evals
    assert len(r0['act_stats']) == len(single['act_stats']) == 8
    for a,b,c in zip(single['act_stats'], r0['act_stats'], r1['act_stats']):
        for x,y,z in zip(a, b, c):
            for k in ('mean', 'std', 'near_zero'): assert abs(x[k] - y[k]) < 1e-5 and y[k] == z[k] # sums over the global batch in float64
            assert torch.equal(x['hist'], y['hist'])

def test_activation_stats_on_compiled_model():
    "ActivationStats sees the same activations when the model is compiled"
    from fastai.callback.hook import ActivationStats
    from fastai.torch_core import set_seed
    from fastxtend_accel.test_utils import synth_learner_digits
    from fastxtend_accel.compiler import is_compiled
    stats = []
    for compiled in (False, True):
        set_seed(0)
        learn = synth_learner_digits(n=512, bs=32, cbs=ActivationStats())
        learn.dls.train.shuffle = False
        if compiled: learn.compile(backend='aot_eager')
        with learn.no_bar(), learn.no_logging(): learn.fit(1, 1e-3)
        assert is_compiled(learn.model) == compiled
        stats.append(learn.activation_stats.stats)
    assert len(stats[0]) == len(stats[1]) == 12
    for x,y in zip(*stats):
        for a,b in zip(x, y): assert abs(a['mean'] - b['mean']) < 1e-6 and abs(a['std'] - b['std']) < 1e-6 # aot_eager: eager's kernels
