"torch.compile for fastai on real processes and the cases the compiler lessons only partly cover: recompiles per fit, bad choices, export, freezing, fine_tune, bf16 under Accelerate."
import importlib, sys
import pytest
import torch
from torch import nn
from fastxtend_accel.patching import compiled_graphs
from fastxtend_accel.extension import ExtendedLearner
from fastai.basics import Learner, Callback, params, set_seed
from fastxtend_accel.test_utils import synth_learner_digits, Chatty, BlockNet, torchrun_cmd, run_cmd, run_ranks
from fastxtend_accel.core import AcceleratorCallback
import fastxtend_accel.compiler as compiler
from fastxtend_accel.compiler import *
from conftest import SCRIPTS

pytestmark = pytest.mark.usefixtures('fresh_state')

graphs = compiled_graphs

def digits(**kwargs):
    "`synth_learner_digits` with the same shuffling every time"
    set_seed(0)
    return synth_learner_digits(**kwargs)

def two_groups(**kwargs): return digits(splitter=lambda m: [params(m[0]), params(m[2])], **kwargs)

def fit(learn, n_epoch=1, lr=1e-2, **kwargs):
    with learn.no_bar(), learn.no_logging(): learn.fit(n_epoch, lr, **kwargs)
    return learn

def train_losses(learn, n_epoch=2): return [v[0] for v in fit(learn, n_epoch).recorder.values]

def weights(model): return torch.cat([o.detach().flatten().float() for o in model.state_dict().values()])

## Compiling

def test_inductor_fit_matches_eager():
    eager = train_losses(digits(n=500), 1)
    compiled = train_losses(digits(n=500).compile(), 1)
    assert graphs() >= 1
    # inductor's fused C++ kernels sum in another order than eager's (and their vector width follows the CPU): < 1e-5 here
    assert torch.allclose(torch.tensor(compiled), torch.tensor(eager), atol=1e-3), (compiled, eager)

@pytest.mark.parametrize('drop_last', [True, False])
def test_at_most_two_recompiles_per_fit(drop_last):
    learn = digits(n=500, bs=64).compile(backend='aot_eager')
    learn.dls.train.drop_last = drop_last
    assert len(learn.dls.valid_ds) % 64 and (drop_last or len(learn.dls.train_ds) % 64), "needs ragged last batches"
    fit(learn)
    assert graphs() == 2, f"{graphs()-1} recompiles in the first fit: only the switch to no_grad should recompile"
    n = graphs()
    fit(learn)
    assert graphs() == n, "a second fit recompiled"

@pytest.mark.bf16
@pytest.mark.parametrize('precision', ['no', 'bf16'])
def test_accelerated_fits_compile_once(precision):
    "Each fit prepares the model again, and with mixed precision Accelerate wraps its forward again: no new graphs"
    learn = digits(n=500, bs=64).accelerate(mixed_precision=precision).compile(backend='aot_eager')
    per_fit = []
    for _ in range(3):
        n = graphs()
        fit(learn)
        per_fit.append(graphs()-n)
    # training, then validation under no_grad; later fits reuse both (with a new wrapper each fit: [2, 2, 2])
    assert per_fit == [2, 0, 0], per_fit

def test_recompile_flag_compiles_afresh():
    learn = fit(digits(n=256).compile(backend='aot_eager'))
    first,n = learn.model._compiled_call_impl,graphs()
    fit(learn)
    assert learn.model._compiled_call_impl is first and graphs() == n, "a plain second fit should reuse the graphs"
    learn.compile(backend='aot_eager', recompile=True)
    fit(learn)
    assert learn.model._compiled_call_impl is not first and graphs() > n
    assert learn.compiler.recompile is False

def test_compile_again_applies_new_settings():
    learn = fit(digits(n=128).compile(backend='eager'))
    first = learn.model._compiled_call_impl
    learn.compile(backend='aot_eager')
    fit(learn)
    assert learn.model._compiled_call_impl is not first

def test_unwraps_torch_compile_wrapper():
    learn = digits(n=256)
    learn.model = torch.compile(learn.model, backend='eager')
    fit(learn.compile(backend='aot_eager'))
    assert type(learn.model) is nn.Sequential and is_compiled(learn.model)

@pytest.mark.parametrize('kwargs,valid', [
    (dict(mode='fast'), ['default', 'reduce-overhead', 'max-autotune', 'max-autotune-no-cudagraphs']),
    (dict(backend='inductr'), ['inductor', 'aot_eager', 'eager']), # dynamo's debugging backends too
])
def test_bad_choices_raise_listing_valid_values(kwargs, valid):
    "Every valid value, where the lessons check one or two (`matmul_precision`'s whole list is in the lesson)"
    with pytest.raises(ValueError) as e: digits(n=64).compile(**kwargs)
    for v in valid: assert repr(v) in str(e.value)

def test_enum_and_plain_strings_accepted():
    cb = CompilerCallback(mode=CompileMode.max_autotune_no_cudagraphs, matmul_precision='medium', backend='eager')
    assert (cb.mode,cb.matmul_precision) == ('max-autotune-no-cudagraphs', 'medium')
    assert CompilerCallback(mode='reduce-overhead', matmul_precision=MatMulPrecision.highest).mode == 'reduce-overhead'

class PrecisionRecorder(Callback):
    def before_train(self): self.precision = torch.get_float32_matmul_precision()

def test_matmul_precision_only_where_tf32_exists():
    before = torch.get_float32_matmul_precision()
    rec = PrecisionRecorder()
    fit(digits(n=128).compile(backend='eager', matmul_precision='medium'), cbs=rec)
    assert rec.precision == ('medium' if compiler._has_tf32() else before)
    assert torch.get_float32_matmul_precision() == before, "the fit's precision leaked"

def test_regional_compiles_each_block_and_matches_eager():
    def learner():
        learn = digits(n=256)
        set_seed(1); learn.model = BlockNet(d=32, n=4)
        return learn
    eager = train_losses(learner(), 1)
    learn = learner().compile(backend='aot_eager', regional=True)
    compiled = train_losses(learn, 1)
    assert all(b._compiled_call_impl is not None for b in learn.model.blocks)
    assert learn.model._compiled_call_impl is None and learn.model.stem._compiled_call_impl is None
    assert torch.allclose(torch.tensor(compiled), torch.tensor(eager), atol=1e-4) # aot_eager runs eager's kernels: < 1e-6 here
    assert graphs() <= 3, "the blocks should share their graphs"

## Graph breaks

def test_dynamo_explain_report_names_the_break():
    "The report's text (the lesson checks the `ExplainOutput`, the cancelled fit and the model left as it was)"
    learn = digits(n=256, cbs=DynamoExplainCallback(print_results=False))
    learn.model = Chatty()
    fit(learn)
    report = learn.dynamo_explain.report()
    assert '1 graph break(s)' in report and "print(end='')" in report and 'test_utils.py' in report

def test_dynamo_explain_without_valid_set_traces_a_training_batch():
    "Without a validation set: one graph traced (the lesson checks no break was found) and no batch trained"
    learn = synth_learner_digits(n=128, valid_pct=0, cbs=DynamoExplainCallback(print_results=False))
    fit(learn)
    assert (learn.dynamo_explain.explain_output.graph_count, learn.train_iter) == (1, 0)

## Saving, exporting, loading

def test_plain_save_loads_into_compiled_learner(tmp_path):
    plain = fit(digits(n=256, path=tmp_path))
    plain.save('plain')
    learn = fit(synth_learner_digits(n=256, path=tmp_path, seed=1).compile(backend='aot_eager'))
    learn.load('plain')
    assert is_compiled(learn.model) and torch.equal(weights(learn.model), weights(plain.model))
    fit(learn) # and it still trains compiled

@pytest.mark.parametrize('accelerate', [False, True])
def test_export_load_learner_predicts_the_same(tmp_path, accelerate):
    learn = digits(n=256, path=tmp_path).compile(backend='aot_eager')
    if accelerate: learn.accelerate()
    fit(learn)
    learn.export('learn.pkl')
    assert is_compiled(learn.model) and isinstance(learn.compiler, CompilerCallback)
    loaded = load_learner(tmp_path/'learn.pkl')
    assert not any(isinstance(cb, (CompilerCallback, DynamoExplainCallback, AcceleratorCallback)) for cb in loaded.cbs)
    assert not is_compiled(loaded.model)
    dl = learn.dls.valid.new(shuffle=False)
    with learn.no_bar(), loaded.no_bar():
        assert torch.equal(loaded.get_preds(dl=dl)[0], learn.get_preds(dl=dl)[0])

def test_load_learner_drops_saved_compiler_callback(tmp_path):
    "A file written by fastai's own export, with the callback pickled in it"
    learn = fit(digits(n=128, path=tmp_path).compile(backend='eager'))
    Learner.export(learn, 'raw.pkl') # fastai's own
    import fastai.learner
    assert any(isinstance(cb, CompilerCallback) for cb in fastai.learner.load_learner(tmp_path/'raw.pkl').cbs) # as it is
    loaded = load_learner(tmp_path/'raw.pkl')
    assert not any(isinstance(cb, CompilerCallback) for cb in loaded.cbs) and not is_compiled(loaded.model)

def test_reimport_does_not_double_wrap(tmp_path):
    "After a reload (the lesson checks which originals are kept), exporting an accelerated, compiled learner still works"
    from fastxtend_accel.loop import learner_file_hooks
    hooks = learner_file_hooks()
    importlib.reload(compiler)
    assert learner_file_hooks() == hooks and {'_compiled_load', '_compiled_export'} <= set(hooks)
    assert ExtendedLearner.export.__module__ == 'fastxtend_accel.loop' and Learner.export.__module__ == 'fastai.learner'
    learn = fit(synth_learner_digits(n=64, path=tmp_path).accelerate().compile(backend='eager'))
    learn.export('learn.pkl')
    loaded = compiler.load_learner(tmp_path/'learn.pkl')
    assert not any(isinstance(cb, (compiler.CompilerCallback, AcceleratorCallback)) for cb in loaded.cbs)

## Freezing and fine-tuning

def test_freeze_to_keeps_every_frozen_param():
    "Adam's moments from the first fit move no frozen parameter, the biases included (the lesson checks the recompile)"
    learn = fit(two_groups(n=256).compile(backend='aot_eager'))
    learn.freeze()
    frozen = [p.detach().clone() for p in learn.model[0].parameters()]
    head = learn.model[2].weight.detach().clone()
    fit(learn)
    for p,f in zip(learn.model[0].parameters(), frozen): assert torch.equal(p, f)
    assert not torch.equal(learn.model[2].weight, head)

def test_freeze_to_warns_when_compiled_by_hand():
    "The warning names the fix (the lesson checks that it warns)"
    learn = two_groups(n=64).accelerate() # a learner that asked for the library, its model compiled by hand
    compile_model(learn.model, backend='eager')
    with pytest.warns(UserWarning, match='learn.compile'): learn.freeze()

class GraphsPerFit(Callback):
    "How many graphs dynamo captured in each fit"
    def __init__(self): self.graphs = []
    def before_fit(self): self.start = graphs()
    def after_fit(self): self.graphs.append(graphs()-self.start)

@pytest.mark.parametrize('compile_frozen,expected', [(False, [False, True]), (True, [True, True])])
def test_fine_tune_compile_frozen(compile_frozen, expected):
    "Dynamo captured graphs in the fits that ran compiled alone (the lesson checks which did), and the default is back"
    learn = two_groups(n=256).compile(backend='aot_eager')
    rec = GraphsPerFit()
    with learn.no_bar(), learn.no_logging(): learn.fine_tune(1, freeze_epochs=1, compile_frozen=compile_frozen, cbs=rec)
    assert [g > 0 for g in rec.graphs] == expected
    assert learn.compile_frozen is True, "fine_tune leaves the learner's default"

## With Accelerate

@pytest.mark.bf16
@pytest.mark.parametrize('compile_first', [True, False])
def test_accelerate_bf16_either_order_compiles(compile_first):
    "In either order dynamo compiles the bare model (the lesson checks that both orders give the same losses)"
    learn = digits(n=256, bs=32)
    learn = (learn.compile(backend='aot_eager').accelerate(mixed_precision='bf16') if compile_first
             else learn.accelerate(mixed_precision='bf16').compile(backend='aot_eager'))
    fit(learn)
    assert type(learn.model) is nn.Sequential and is_compiled(learn.model) and graphs() >= 1

@pytest.mark.bf16
def test_two_processes_bf16_compiled(tmp_path):
    r0,r1 = run_ranks(torchrun_cmd(2) + [SCRIPTS/'compile_ddp.py', tmp_path], tmp_path)
    for name in ('compile_first', 'accelerate_first', 'eager', 'fp32'):
        assert r0[name]['num_processes'] == 2 and (r0[name]['rank'], r1[name]['rank']) == (0, 1)
        assert r0[name]['compiled'] == (name != 'eager') and r0[name]['model_type'] == 'Sequential'
        assert torch.equal(r0[name]['weights'], r1[name]['weights']), f"{name}: weights differ across ranks"
    assert r0['compile_first']['mixed_precision'] == 'bf16' and r0['compile_first']['graphs'] >= 1
    assert torch.equal(r0['compile_first']['weights'], r0['accelerate_first']['weights']), "the two orders trained differently"
    bf16,fp32 = r0['compile_first']['weights'],r0['fp32']['weights']
    # compiled (aot_eager) and eager bf16 run the same ops on the same batches: equal on any CPU. Not compared with fp32 within a
    # tolerance: bf16's rounding moves these weights by ~0.05 after 8 Adam steps, as much as a step moves them
    assert torch.equal(bf16, r0['eager']['weights']), "compiling changed what bf16 trains"
    assert not torch.equal(bf16, fp32), "bf16 trained as fp32"
    start = synth_learner_digits(n=256, bs=32, seed=42).model
    assert not torch.equal(bf16, torch.cat([p.detach().flatten() for p in start.parameters()])), "nothing trained"

## Version gate

def test_old_torch_gets_actionable_error():
    code = "import torch; torch.__version__ = '2.1.0'\nimport fastxtend_accel.compiler"
    p = run_cmd([sys.executable, '-c', code], timeout=120, check=False)
    assert p.returncode != 0
    # the library's gate (`fastxtend_accel.patching`), before the compiler's own (`fastxtend_accel.dynamo`, below its floor)
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: fastxtend_accel supports torch>=2.9,<2.14, but torch 2.1.0 is installed: "
                           "`pip install 'torch>=2.9,<2.14'`"), last
