"""GPU checks (issue 14): Accelerate's fp16 `GradScaler` and bf16 on CUDA, inductor and CUDA graphs inside fastai's loop,
checkpoints moved between the GPU and the CPU, a launch on one GPU, and batches of a dataset on the GPU.

    pytest -m gpu -rs tests/test_gpu.py   # on a CUDA machine (`bash tools/gpu_check.sh` installs, then runs this)

Without CUDA the `gpu` tests skip and say why (`-rs`); the GPU benchmark's smoke run is in tests/test_bench.py.
One GPU only: NCCL refuses two processes on one GPU ("Duplicate GPU detected"), so DDP and `SyncBatchNorm` are not
tested here. The multi-process paths are tested with gloo on CPU (the other test files, the `#| multiproc` lessons);
here one process is launched with torchrun on the GPU.
"""
import os
os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8') # deterministic cuBLAS for the bit-exact resume; read when cuBLAS starts
import re

import pytest
import torch
from torch import nn
from fastxtend_accel.patching import compiled_graphs
from fastai.basics import Callback, set_seed
from fastai.callback.fp16 import MixedPrecision
from fastxtend_accel.all import * # the patches: `accelerate`, `compile`, `save_state`/`load_state`
from fastxtend_accel.test_utils import synth_learner_digits, tiny_mlp, torchrun_cmd, run_cmd
from conftest import REPO, SCRIPTS

pytestmark = pytest.mark.usefixtures('fresh_state')

def gpu(f):
    "Mark test `f` as a GPU test (`pytest -m gpu`), skipped with its reason where CUDA is missing"
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(),
                                              reason='needs a CUDA GPU: run `bash tools/gpu_check.sh` on one')(f))

def digits(n=None, hidden=256, **kwargs):
    "All 1797 digits by default: 23 training batches of 64, and a ragged last validation batch"
    set_seed(0)
    return synth_learner_digits(n=n, hidden=hidden, **kwargs)

def fit(learn, n_epoch=1, lr=1e-2, **kwargs):
    with learn.no_bar(), learn.no_logging(): learn.fit(n_epoch, lr, **kwargs)
    return learn

graphs = compiled_graphs

def weights(model): return [o.detach().clone() for o in model.state_dict().values()]

def first_layer_dtypes(learn):
    "The dtypes of the first layer's outputs, recorded from now on"
    seen = []
    learn.model[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    return seen

class LossDtype(Callback):
    "Record the dtype of the predictions and of the loss that is backpropagated"
    def after_loss(self):
        if self.training: self.pred_dtype,self.loss_dtype = self.learn.pred.dtype,self.learn.loss_grad.dtype

## Mixed precision through Accelerate

class InfGrads(Callback):
    "At training batch `at`, fill every gradient with inf; record the loss scale and the weights around that step"
    def __init__(self, at=3): self.at,self.n = at,0
    def after_backward(self):
        if self.n != self.at: return
        self.scale_before = self.learn.accelerator.scaler.get_scale()
        self.before = [p.detach().clone() for p in self.learn.model.parameters()]
        for p in self.learn.model.parameters(): p.grad.fill_(float('inf'))
    def after_step(self):
        if self.n == self.at:
            self.scale_after = self.learn.accelerator.scaler.get_scale()
            self.after = [p.detach().clone() for p in self.learn.model.parameters()]
            self.skipped = self.learn.accelerator.acc_opt.step_was_skipped
        self.n += 1

@gpu
def test_batches_of_cuda_tensors():
    "A dataset already on the GPU: torch's and fastai's loaders fetch each batch at once, as they make it item by item"
    from torch.utils.data import TensorDataset, DataLoader as TorchDL
    from fastai.basics import Datasets, TfmdDL
    from fastxtend_accel.fetching import batch_fetcher, torch_batches, torch_fetcher
    x,y = torch.randn(50, 3, device='cuda'),torch.arange(50, device='cuda')
    def same(a, b): return len(a) == len(b) and all(torch.equal(u, v) and u.device == v.device for u,v in zip(a, b))
    dl = TorchDL(TensorDataset(x, y), batch_size=8)
    fetched,by_torch = list(torch_batches(dl, torch_fetcher(dl))),list(dl)
    assert len(fetched) == 7 and all(map(same, fetched, by_torch))
    for ds in TensorDataset(x, y),Datasets(list(range(50)), [[x.__getitem__], [y.__getitem__]]):
        fdl = TfmdDL(ds, bs=8)
        for idxs in ([3, 1, 7], [-1, 2, -10]): # negative ones by indexing, from the end
            assert same(batch_fetcher(fdl)(idxs), fdl.do_batch([fdl.do_item(i) for i in idxs]))

@gpu
def test_fp16_grad_scaler_skips_overflow_step():
    learn = digits().accelerate(mixed_precision='fp16')
    layer,loss_dtype,inf = first_layer_dtypes(learn),LossDtype(),InfGrads(at=3)
    start = learn.validate()[0]
    fit(learn, 2, cbs=[inf, loss_dtype])
    assert isinstance(learn.accelerator.scaler, torch.amp.GradScaler), "fp16 on CUDA should scale the loss"
    assert layer[0] == torch.float16 and loss_dtype.loss_dtype == torch.float32
    assert inf.skipped, "the step with inf gradients was not reported as skipped"
    assert inf.scale_after == inf.scale_before/2, (inf.scale_before, inf.scale_after)
    assert all(torch.equal(a, b) for a,b in zip(inf.before, inf.after)), "the overflow step changed the weights"
    assert learn.accelerator.scaler.get_scale() > 1
    (train0,*_),(train1,valid,acc) = learn.recorder.values
    assert train1 < train0 and valid < start/2 and acc > 0.9, (start, learn.recorder.values)

@gpu
def test_bf16_on_cuda():
    learn = digits().accelerate(mixed_precision='bf16')
    layer,loss_dtype = first_layer_dtypes(learn),LossDtype()
    fit(learn, 2, cbs=loss_dtype)
    assert learn.accelerator.scaler is None, "bf16 needs no loss scaling"
    assert layer[0] == torch.bfloat16, "the layers should run in bf16"
    assert loss_dtype.pred_dtype == torch.float32 and loss_dtype.loss_dtype == torch.float32 # Accelerate returns fp32 outputs
    p = next(learn.model.parameters())
    assert p.is_cuda and p.dtype == torch.float32, "the weights stay fp32"
    assert learn.recorder.values[-1][2] > 0.9, learn.recorder.values

@gpu
@pytest.mark.parametrize('precision', ['fp16', 'bf16'])
def test_fastai_to_fp16_on_top_stops_with_the_fix(precision):
    learn = digits(n=256).accelerate(mixed_precision=precision).to_fp16()
    w = weights(learn.model)
    with pytest.raises(ValueError, match=re.escape('learn.remove_cb(MixedPrecision)')): fit(learn)
    assert type(learn.model) is nn.Sequential and all(torch.equal(a, b) for a,b in zip(weights(learn.model), w)), "the failed fit changed the model"
    learn.remove_cb(MixedPrecision)
    fit(learn, 2)
    (train0,*_),(train1,_,acc) = learn.recorder.values
    assert train1 < train0 and acc > 0.5, learn.recorder.values

## torch.compile with inductor on CUDA

def close(a, b, atol): return torch.allclose(torch.tensor(a), torch.tensor(b), atol=atol)

@gpu
@pytest.mark.parametrize('mode', ['default', 'max-autotune-no-cudagraphs'])
def test_inductor_on_cuda(mode):
    "Two fits: at most 2 recompiles in the first (the switch to no_grad, the ragged batch), none in the second; results as eager's"
    eager = digits().accelerate()
    eager_values = [fit(eager).recorder.values[0] for _ in range(2)]
    # fp32 matmuls as eager's (`learn.compile()` would allow TensorFloat32), so that only compiling differs
    learn = digits().accelerate().compile(mode=mode, matmul_precision='highest')
    values,counts = [],[]
    for _ in range(2):
        values.append(fit(learn).recorder.values[0])
        counts.append(graphs())
    assert is_compiled(learn.model) and counts[0] >= 1, "nothing was compiled"
    assert counts[0]-1 <= 2, f"{counts[0]-1} recompiles in the first fit"
    assert counts[1] == counts[0], f"the second fit recompiled ({counts})"
    # Triton's fused kernels vs eager's cuBLAS: sums in other orders, over two fits; not yet measured on a GPU
    for v,e in zip(values, eager_values):
        assert close(v[:2], e[:2], 2e-3) and abs(v[2]-e[2]) < 0.01, (values, eager_values) # losses, accuracy
    preds,targs = learn.get_preds()
    eager_preds,eager_targs = eager.get_preds()
    assert torch.equal(targs, eager_targs) and torch.allclose(preds, eager_preds, atol=2e-3)
    assert graphs() == counts[1], "get_preds recompiled"

@gpu
@pytest.mark.parametrize('mode', ['reduce-overhead', 'max-autotune'])
def test_cuda_graph_modes_refused(mode):
    "The modes that replay CUDA graphs are refused before anything is compiled, naming the mode that works"
    learn = digits().accelerate().compile(mode=mode)
    w = weights(learn.model)
    with pytest.raises(ValueError, match="use mode='max-autotune-no-cudagraphs'"): fit(learn)
    assert not is_compiled(learn.model) and all(torch.equal(a, b) for a,b in zip(weights(learn.model), w))
    fit(learn.compile(mode='max-autotune-no-cudagraphs'))
    assert is_compiled(learn.model)

@gpu
def test_compile_with_bf16():
    eager,learn = digits().accelerate(mixed_precision='bf16'),digits().accelerate(mixed_precision='bf16').compile()
    counts = []
    for n_epoch in (2, 1):
        fit(eager, n_epoch); fit(learn, n_epoch)
        counts.append(graphs())
    assert counts[0] >= 1 and counts[0]-1 <= 2 and counts[1]-counts[0] <= 2, f"graphs after each fit: {counts}"
    valid,acc = learn.recorder.values[-1][1:]
    # digits reach ~0.95 in 3 epochs; compiled bf16 vs eager bf16: other kernels, the same rounding to bf16, losses of ~0.2
    assert acc > 0.9 and abs(valid - eager.recorder.values[-1][1]) < 0.1, (learn.recorder.values, eager.recorder.values)

## Checkpoints

def dropout_digits(precision=None):
    "A learner whose model has dropout (so the CUDA random state matters), accelerated with `precision` unless None"
    set_seed(0)
    learn = synth_learner_digits(n=512, bs=32)
    torch.manual_seed(0)
    learn.model = tiny_mlp(p=0.3)
    return learn if precision is None else learn.accelerate(mixed_precision=precision)

@gpu
@pytest.mark.parametrize('precision', ['no', 'fp16'])
def test_checkpoint_resumes_on_gpu_exactly_and_loads_on_cpu(tmp_path, precision):
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        learn = dropout_digits(precision)
        fit(learn)
        learn.save_state(tmp_path/'ck')
        fit(learn)
        ref,ref_values = weights(learn.model),learn.recorder.values
        assert ref[0].is_cuda
        again = dropout_digits(precision)
        again.load_state(tmp_path/'ck')
        fit(again)
        assert all(torch.equal(a, b) for a,b in zip(weights(again.model), ref)), "resuming on the GPU is not exact"
        assert again.recorder.values == ref_values
    finally: torch.use_deterministic_algorithms(False)
    # the same checkpoint on the CPU, without Accelerate: every tensor comes back on the CPU, and training goes on
    cpu = dropout_digits()
    cpu.load_state(tmp_path/'ck')
    saved = torch.load(checkpoint_to_weights(tmp_path/'ck', tmp_path/'ck.pth', with_opt=False), map_location='cpu', weights_only=True)
    assert all(not v.is_cuda and torch.equal(v, saved[k]) for k,v in cpu.model.state_dict().items())
    fit(cpu)
    assert not next(cpu.model.parameters()).is_cuda and cpu.recorder.values[-1][2] > 0.5, cpu.recorder.values

## Launching on one GPU

@gpu
def test_one_process_torchrun_on_the_gpu(tmp_path):
    "torchrun with one process trains on the GPU, and as the same fit in this process does"
    run_cmd(torchrun_cmd(1) + [SCRIPTS/'launch_check.py', tmp_path], cwd=REPO)
    res = torch.load(tmp_path/'rank0.pt', weights_only=False)
    assert res['world'] == 1 and all(p.is_cuda for p in res['params'])
    learn = synth_learner_digits(n=256, bs=32).accelerate()
    fit(learn)
    # the same kernels in another process; cuBLAS may choose another algorithm there (another order of sums)
    assert all(torch.allclose(a, b, atol=1e-5) for a,b in zip(res['params'], learn.model.parameters()))
