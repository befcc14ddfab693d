"""fastai.vision on one CUDA GPU (issue 14, item 4): generated images through `ImageBlock`, `vision_learner(resnet18,
pretrained=False)`, `.accelerate(mixed_precision='bf16')`, `.compile()`, `fine_tune`, `predict`, and `notebook_launcher`
after `from fastai.vision.all import *`.

    python tests/scripts/vision_check.py            # tools/gpu_check.sh runs it where CUDA is available

fastai users report that importing fastai initialises CUDA, after which `notebook_launcher` can't fork its processes. So
the import comes first, as in a notebook; then come the checks a multi-GPU `notebook_launcher` makes before it forks (no
Accelerate state yet, CUDA not initialised) and two forked processes that use the GPU. Building fastai's loaders does
initialise CUDA (fastai's `default_device()` asks `torch.cuda.current_device()`): in a notebook they are built inside the
function handed to `notebook_launcher`, as Accelerate's documentation says, and this check records that it still holds.
Last, the training itself through `notebook_launcher` (one process: NCCL can't share one GPU between two).
Exits non-zero, naming the check, if one fails.
"""
import argparse, tempfile, time
from fastai.vision.all import *
import numpy as np
import torch
import torch.multiprocessing as mp
from PIL import Image
from accelerate import notebook_launcher
from accelerate.utils import patch_environment
from fastxtend_accel.patching import compiled_graphs, clear_compiled_graphs
from fastxtend_accel.all import *
from fastxtend_accel.patching import accelerate_state

cuda_after_import = torch.cuda.is_initialized()

def make_images(path, n=160, size=40):
    "`n` PNG images per class, in one folder per class: noise with a strong red ('red') or blue ('blue') cast"
    rng = np.random.default_rng(0)
    for label,channel in (('red', 0), ('blue', 2)):
        (path/label).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            a = rng.integers(0, 128, (size, size, 3), dtype=np.uint8)
            a[..., channel] += 127
            Image.fromarray(a).save(path/label/f'{i:03d}.png')
    return path

def image_dls(path):
    "Small batches, so that BatchNorm's running statistics settle within a few epochs of a model trained from scratch"
    return DataBlock(blocks=(ImageBlock, CategoryBlock), get_items=get_image_files, get_y=parent_label,
                     splitter=RandomSplitter(0.25, seed=42), item_tfms=Resize(32)).dataloaders(path, bs=8, num_workers=2)

def use_gpu(rank):
    "What a process forked by `notebook_launcher` does first: work on the GPU"
    if torch.ones(4, device='cuda').sum().item() != 4: raise RuntimeError('wrong sum')

def train(path, args, res):
    "The training function a notebook hands to `notebook_launcher`"
    learn = vision_learner(image_dls(path), resnet18, pretrained=False, metrics=accuracy)
    learn.accelerate(mixed_precision='bf16').compile(backend=args.backend)
    clear_compiled_graphs()
    start = time.perf_counter()
    with learn.no_bar(): learn.fine_tune(args.epochs) # the frozen epoch runs uncompiled, the unfrozen ones compiled
    res['fine_tune'] = f'{time.perf_counter()-start:.1f}s, {compiled_graphs()} graph(s) captured'
    _,valid_loss,acc = learn.recorder.values[-1]
    res['final'] = f'valid loss {valid_loss:.4f}, accuracy {acc:.3f}'
    assert acc >= args.min_accuracy, f'fine_tune reached accuracy {acc:.3f} only'
    assert is_compiled(learn.model) and next(learn.model.parameters()).device.type == learn.accelerator.device.type
    fns = learn.dls.valid.items[:8]
    with learn.no_bar(): preds = [learn.predict(fn) for fn in fns]
    right = sum(label == parent_label(fn) for fn,(label,_,_) in zip(fns, preds))
    res['predict'] = f'{right}/{len(fns)} right, probabilities summing to {float(preds[0][2].sum()):.4f}'
    assert right >= round(len(fns)*args.min_accuracy)-1 and all(abs(float(p.sum()) - 1) < 1e-3 for _,_,p in preds), res['predict']
    learn.export(path/'export.pkl')
    cpu = load_learner(path/'export.pkl', cpu=True)
    with cpu.no_bar(): again = [cpu.predict(fn)[0] for fn in fns]
    res['export'] = f'load_learner(cpu=True) predicts as the GPU learner on {sum(a == p[0] for a,p in zip(again, preds))}/{len(fns)}'
    assert not is_compiled(cpu.model) and not any(isinstance(cb, (AcceleratorCallback, CompilerCallback)) for cb in cpu.cbs)
    assert sum(a == p[0] for a,p in zip(again, preds)) >= len(fns)-1, res['export']

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--backend', default='inductor', help='compile backend')
    p.add_argument('--n', type=int, default=160, help='images per class')
    p.add_argument('--epochs', type=int, default=3, help='unfrozen epochs of `fine_tune`')
    p.add_argument('--min-accuracy', type=float, default=0.9, help='validation accuracy `fine_tune` must reach')
    args = p.parse_args()
    res,path = {},make_images(Path(tempfile.mkdtemp())/'colours', args.n)
    res['CUDA initialised by the import'] = str(cuda_after_import)
    state = accelerate_state('_mixed_precision', partial=False), accelerate_state('num_processes', partial=True)
    res['Accelerate state before the launch'] = 'none' if state == (None, None) else str(state)
    # torch's own `is_available` would poison forking (it asks the driver); Accelerate asks NVML, as here
    with patch_environment(PYTORCH_NVML_BASED_CUDA_CHECK='1'): has_cuda = torch.cuda.is_available()
    if has_cuda:
        try:
            mp.start_processes(use_gpu, nprocs=2, start_method='fork')
            res['2 forked processes'] = 'used the GPU'
        except Exception as e: res['2 forked processes'] = f'FAILED: {str(e).strip().splitlines()[-1]}'
    image_dls(path)
    res['CUDA initialised by building the loaders (fastai)'] = str(torch.cuda.is_initialized())
    notebook_launcher(train, args=(path, args, res), num_processes=1)
    print('\nvision check:')
    for k,v in res.items(): print(f'  {k}: {v}')
    assert res['Accelerate state before the launch'] == 'none', "a multi-GPU `notebook_launcher` would refuse to start"
    assert 'FAILED' not in res.get('2 forked processes', ''), "a multi-GPU `notebook_launcher`'s processes would fail"
    print('vision check: OK')

if __name__ == '__main__': main()
