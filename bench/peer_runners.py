"""The runners of `bench_peers.py`: one training run each, written as that framework's users write it.

Every runner gets the model, the training tensors (and held-out ones, for the frameworks whose loaders want a validation
set), the number of warm-up batches and a `clock`. It trains two epochs: epoch 0 is the warm-up, cut after `warmup`
batches by the framework's own means, and epoch 1, a whole epoch, is timed by `clock` (`with clock(epoch):` around a
hand-written epoch, `clock.start()`/`clock.stop()` in a framework's epoch events). Batches of 64 per process, shuffled,
the last partial one dropped, no loader workers; AdamW with torch's defaults; `F.cross_entropy`, or for the `-idiom` fastai runners what fastai users write
(`CrossEntropyLossFlat()`, fastai's default for a classifier, and `metrics=accuracy`). Validation is not run.
On several processes (started by torchrun) each runner uses its framework's own way of sharding data and syncing
gradients. Each runner imports its framework itself, so that a process imports only what its runner needs (no
Lightning beside fastai, no fastxtend_accel beside stock fastai).
"""
import os
from functools import partial
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

BS = 64

def world_size(): return int(os.environ.get('WORLD_SIZE', 1))

def torch_loop(model, x, y, xv, yv, warmup, clock):
    "Plain torch: a `DataLoader` over a `TensorDataset`; on several processes `DistributedDataParallel` (gloo)"
    ds,ddp = TensorDataset(x, y),world_size() > 1
    if ddp:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.utils.data.distributed import DistributedSampler
        dist.init_process_group('gloo')
        sampler = DistributedSampler(ds, shuffle=True, seed=0)
        dl = DataLoader(ds, batch_size=BS, sampler=sampler, drop_last=True)
        model = DDP(model)
    else: dl = DataLoader(ds, batch_size=BS, shuffle=True, drop_last=True)
    opt = torch.optim.AdamW(model.parameters())
    for epoch in range(2):
        if ddp: sampler.set_epoch(epoch)
        with clock(epoch):
            for i,(xb,yb) in enumerate(dl):
                if i == warmup and epoch == 0: break
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
                opt.step()
                opt.zero_grad()
    if ddp: dist.destroy_process_group()

def accelerate_loop(model, x, y, xv, yv, warmup, clock):
    "Hugging Face Accelerate: `accelerator.prepare(model, opt, dl)` and `accelerator.backward`"
    from accelerate import Accelerator
    acc = Accelerator(cpu=True)
    dl = DataLoader(TensorDataset(x, y), batch_size=BS, shuffle=True, drop_last=True)
    model,opt,dl = acc.prepare(model, torch.optim.AdamW(model.parameters()), dl)
    for epoch in range(2):
        with clock(epoch):
            for i,(xb,yb) in enumerate(dl):
                if i == warmup and epoch == 0: break
                loss = F.cross_entropy(model(xb), yb)
                acc.backward(loss)
                opt.step()
                opt.zero_grad()

def fabric_loop(model, x, y, xv, yv, warmup, clock):
    "Lightning Fabric: `fabric.setup`, `fabric.setup_dataloaders` and `fabric.backward`"
    from lightning.fabric import Fabric
    n = world_size()
    fabric = Fabric(accelerator='cpu', devices=n, strategy='ddp' if n > 1 else 'auto')
    fabric.launch()
    model,opt = fabric.setup(model, torch.optim.AdamW(model.parameters()))
    dl = fabric.setup_dataloaders(DataLoader(TensorDataset(x, y), batch_size=BS, shuffle=True, drop_last=True))
    for epoch in range(2):
        with clock(epoch):
            for i,(xb,yb) in enumerate(dl):
                if i == warmup and epoch == 0: break
                loss = F.cross_entropy(model(xb), yb)
                fabric.backward(loss)
                opt.step()
                opt.zero_grad()

def lightning_trainer(model, x, y, xv, yv, warmup, clock):
    "Lightning `Trainer` fitting a `LightningModule` that logs its loss; the warm-up epoch ends as Lightning's docs say"
    import lightning as L
    class Classifier(L.LightningModule):
        def __init__(self, model):
            super().__init__()
            self.model = model
        def training_step(self, batch, batch_idx):
            xb,yb = batch
            loss = F.cross_entropy(self.model(xb), yb)
            self.log('train_loss', loss)
            return loss
        def configure_optimizers(self): return torch.optim.AdamW(self.parameters())
        def on_train_batch_start(self, batch, batch_idx):
            if self.current_epoch == 0 and batch_idx == warmup: return -1 # skips the rest of the epoch
    class Clock(L.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            if trainer.current_epoch == 1: clock.start()
        def on_train_epoch_end(self, trainer, pl_module):
            if trainer.current_epoch == 1: clock.stop()
    n = world_size()
    trainer = L.Trainer(accelerator='cpu', devices=n, strategy='ddp' if n > 1 else 'auto', max_epochs=2,
                        enable_checkpointing=False, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[Clock()])
    trainer.fit(Classifier(model), DataLoader(TensorDataset(x, y), batch_size=BS, shuffle=True, drop_last=True))

def fastai_dls(loader, x, y, xv, yv):
    "fastai `DataLoaders` over the tensors, built as a fastai user builds them with `loader`"
    from fastai.basics import DataLoaders, Datasets, DataBlock, TransformBlock, CategoryBlock, IndexSplitter
    if loader == 'from_dsets':
        return DataLoaders.from_dsets(TensorDataset(x, y), TensorDataset(xv, yv), bs=BS, num_workers=0)
    if loader == 'torch':
        return DataLoaders(DataLoader(TensorDataset(x, y), batch_size=BS, shuffle=True, drop_last=True),
                           DataLoader(TensorDataset(xv, yv), batch_size=BS))
    xs,ys = torch.cat([x, xv]),torch.cat([y, yv]) # the items are indices; the held-out ones come last
    valid = list(range(len(x), len(xs)))
    if loader == 'Datasets':
        dsets = Datasets(range(len(xs)), [[xs.__getitem__], [ys.__getitem__]], splits=(list(range(len(x))), valid))
        return dsets.dataloaders(bs=BS, num_workers=0)
    if loader == 'DataBlock':
        labels = ys.tolist()
        dblock = DataBlock(blocks=(TransformBlock, CategoryBlock), get_x=lambda i: xs[i], get_y=lambda i: labels[i],
                           splitter=IndexSplitter(valid))
        return dblock.dataloaders(range(len(xs)), bs=BS, num_workers=0)
    raise ValueError(f"Unknown loader {loader!r}: use one of ['from_dsets', 'torch', 'Datasets', 'DataBlock']")

def fastai_learner(model, x, y, xv, yv, warmup, clock, loader='from_dsets', accelerate=False, idiomatic=False):
    "A fastai `Learner` over `loader`'s `DataLoaders`, with AdamW through `OptimWrapper`; `.accelerate()` if asked"
    from fastai.basics import (Learner, Callback, OptimWrapper, CancelTrainException, CancelValidException,
                               CrossEntropyLossFlat, accuracy)
    import fastai.callback.progress # the progress bar fastai users see (`fastai.*.all` import it), off below
    if accelerate: import fastxtend_accel.core # patches `Learner`: `learn.accelerate()`
    class Clock(Callback):
        order = 100 # after the other callbacks: the warm-up ends after a whole batch
        def before_train(self):
            if self.epoch == 1: clock.start()
        def after_batch(self):
            if self.epoch == 0 and self.training and self.iter == warmup - 1: raise CancelTrainException()
        def after_train(self):
            if self.epoch == 1: clock.stop()
        def before_validate(self): raise CancelValidException()
    # idiomatic: fastai's loss for a classifier (its `BaseLoss` wraps the tensors in `TensorBase`) and a metric
    loss,metrics = (CrossEntropyLossFlat(),accuracy) if idiomatic else (F.cross_entropy,None)
    learn = Learner(fastai_dls(loader, x, y, xv, yv), model, loss_func=loss, metrics=metrics,
                    opt_func=partial(OptimWrapper, opt=torch.optim.AdamW), lr=1e-3, cbs=Clock())
    if accelerate: learn.accelerate()
    with learn.no_bar(), learn.no_logging(): learn.fit(2)
