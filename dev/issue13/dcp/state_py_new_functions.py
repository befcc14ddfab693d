# ---- state.py: new/changed functions (imports to add: `import torch.distributed as dist`, `import torch.distributed.checkpoint as dcp`)
# ---- __all__ gains `checkpoint_to_weights` (exported); `Learner.save_state`, `Learner.finish_save`, `Learner.load_state` are patches

# replaces `_set_rng_state` (cell #299e6939), adds `_new_process_rng`
def _new_process_rng(st, rank):
    "Random states for process `rank`, which the checkpoint's run did not have: streams of its own, seeded from process 0's `st`"
    g = torch.Generator()
    g.set_state(st['torch'])
    return dict(seed=int(torch.randint(2**31, (1,), generator=g))+rank, dl=st['dl'])

def _set_rng_state(learn, st):
    if 'seed' in st:
        random.seed(st['seed']); np.random.seed(st['seed']); torch.manual_seed(st['seed'])
        return _train_dl(learn).rng.setstate(st['dl']) if st['dl'] is not None else None
    random.setstate(st['python'])
    np.random.set_state((st['numpy'][0], st['numpy'][1].numpy().astype(np.uint32), *st['numpy'][2:]))
    torch.set_rng_state(st['torch'])
    if st['cuda']: torch.cuda.set_rng_state_all(st['cuda'])
    if st['dl'] is not None: _train_dl(learn).rng.setstate(st['dl'])


# replaces cells #182e0f7c (_atomic_save) and #183b8a87 (save_state)
def _atomic_save(obj, fn):
    tmp = fn.with_name(fn.name + '.tmp')
    torch.save(obj, tmp)
    os.replace(tmp, fn)

def _rank(learn): return learn.accelerator.process_index if learn.accelerator else 0
def _dist_kw(): return dict(no_dist=not (dist.is_available() and dist.is_initialized()))

def _split(o, key, tensors):
    "`o` (nested dicts and lists) with `None` for each tensor, which goes into `tensors` under its dotted path"
    if isinstance(o, Tensor): tensors[key] = o; return None
    sub = lambda k: f'{key}.{k}' if key else str(k)
    if isinstance(o, dict): return {k: _split(v, sub(k), tensors) for k,v in o.items()}
    if isinstance(o, (list, tuple)): return type(o)(_split(v, sub(i), tensors) for i,v in enumerate(o))
    return o

def _join(o, key, tensors):
    "Undo `_split`: `o` with the tensors of `tensors` back in place"
    if key in tensors: return tensors[key]
    sub = lambda k: f'{key}.{k}' if key else str(k)
    if isinstance(o, dict): return {k: _join(v, sub(k), tensors) for k,v in o.items()}
    if isinstance(o, (list, tuple)): return type(o)(_join(v, sub(i), tensors) for i,v in enumerate(o))
    return o

_async_groups = {}
def _async_group():
    "A gloo process group of its own for background writes, so they never interleave with training's collectives"
    if _dist_kw()['no_dist']: return None
    world = dist.group.WORLD
    if world not in _async_groups: _async_groups[world] = dist.new_group(backend='gloo')
    return _async_groups[world]

def _put_in_place(tmp, path):
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)

@patch
def save_state(self:Learner,
    path:str|Path, # Checkpoint folder to write (replaced if it exists)
    position:dict|None=None, # Where the fit stands (`CheckpointCallback` fills it in)
    async_save:bool=False # Return once the model and optimizer are copied and write them in the background (`finish_save` puts them in place)
):
    "Write model and optimizer (each process its shard, through `torch.distributed.checkpoint`), scaler, `Recorder` history, position and every process's random states to `path`"
    self.finish_save() # one checkpoint in flight at a time
    path = Path(path)
    tmp = path.with_name(f'.tmp-{path.name}')
    if self.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    self.barrier()
    _atomic_save(_rng_state(self), tmp/f'rng-{_rank(self)}.pt')
    tensors = dict(model=get_model(self.model).state_dict())
    opt = _split(_plain(self.opt.state_dict()), '', tensors.setdefault('opt', {})) if self.opt else None
    if self.is_main_process:
        rec = self.recorder
        scaler = getattr(self.accelerator, 'scaler', None) if self.accelerator is not None else None
        state = dict(opt=opt, opt_devices={k: t.device.type for k,t in tensors.get('opt', {}).items()}, frozen_idx=getattr(self.opt, 'frozen_idx', 0), scaler=scaler.state_dict() if scaler else None,
                     recorder=_plain(dict(lrs=list(rec.lrs), iters=list(rec.iters), losses=[torch.as_tensor(l) for l in rec.losses],
                                          values=rec.values, smooth=(rec.smooth_loss.val, rec.smooth_loss.count))),
                     position=_plain(position or {}), model_desc=_model_desc(self.model),
                     world_size=self.accelerator.num_processes if self.accelerator else 1)
        _atomic_save(state, tmp/'state.pt')
    # DCP's last step, on process 0, waits for every process's files, then writes `.metadata`: process 0 can rename on its own
    if async_save: self._saving = (dcp.async_save(tensors, checkpoint_id=tmp, process_group=_async_group(), **_dist_kw()), tmp, path)
    else:
        dcp.save(tensors, checkpoint_id=tmp, **_dist_kw())
        if self.is_main_process: _put_in_place(tmp, path)
        self.barrier()
    return path

@patch
def finish_save(self:Learner,
    wait:bool=True # Wait for the files; else only finish if they are written
)->Path|None:
    "Put the checkpoint that `save_state(async_save=True)` writes in place once written; its path on the main process when done"
    pending = getattr(self, '_saving', None)
    if pending is None or not (wait or pending[0].done()): return None
    self._saving = None
    fut,tmp,path = pending
    fut.result() # raises if a write failed
    if not self.is_main_process: return None
    _put_in_place(tmp, path)
    return path

# replaces cells #0d3fdccb (_load) and #ce6f6491 (load_state); `_check_model` and `_restore_recorder` are unchanged (already their own cells)
def _load(fn):
    if not fn.exists(): raise ValueError(f"Checkpoint file {fn} is missing: the checkpoint is incomplete")
    try: return torch.load(fn, weights_only=True, map_location='cpu')
    except Exception as e: raise ValueError(f"Can't read checkpoint file {fn} (truncated or corrupt?): {e}") from None

def _metadata(path):
    "What DCP wrote to `path`: each tensor's key, size and dtype"
    try: return dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    except Exception as e: raise ValueError(f"Can't read the index of checkpoint {path} (truncated or corrupt?): {e}") from None

def _dcp_load(tensors, path, **kwargs):
    "DCP's `load` (its `CheckpointException` is a `BaseException`), with an error saying which checkpoint is damaged"
    try: dcp.load(tensors, checkpoint_id=path, **kwargs)
    except (Exception, dcp.CheckpointException) as e: raise ValueError(f"Can't read the tensors of checkpoint {path} (truncated or corrupt?): {e}") from None

def _empty(m, device='cpu'):
    "An empty whole tensor for DCP entry `m`"
    return torch.empty(m.size, dtype=m.properties.dtype, device=device)

def _opt_tensors(opt, md, devices):
    "Empty tensors to load `opt`'s saved states into: a parameter's states shaped and sharded like it (FSDP2), others on the device they were saved from"
    params = [p for p,*_ in opt.all_params()]
    def param(k): # the fastai `Optimizer` and `OptimWrapper` state dicts both list states as `state.<param index>.<name>`
        parts = k.split('.')
        return params[int(parts[1])] if parts[0] == 'state' and len(parts) > 2 and parts[1].isdigit() and int(parts[1]) < len(params) else None
    def empty(k, m):
        p = param(k)
        if p is not None and tuple(p.shape) == tuple(m.size): return torch.empty_like(p.detach(), dtype=m.properties.dtype)
        return _empty(m, 'cpu' if devices.get(k, 'cpu') == 'cpu' else (p if p is not None else params[0]).device)
    return {k[4:]: empty(k[4:], m) for k,m in md.items() if k.startswith('opt.')}

@patch
def load_state(self:Learner,
    path:str|Path, # Checkpoint folder written by `save_state`, on any number of processes
    with_rng:bool=True # Restore random states too (`CheckpointCallback` does it at the right batch itself)
)->dict:
    "Restore what `save_state` wrote to `path`, resharding model and optimizer over this run's processes; returns the saved position"
    path = Path(path)
    state = _load(path/'state.pt')
    _check_model(state['model_desc'], self.model, path)
    md,rank = _metadata(path),_rank(self)
    rng = _load(path/f'rng-{rank}.pt') if rank < state['world_size'] else _new_process_rng(_load(path/'rng-0.pt'), rank)
    if self.opt is None: self.create_opt()
    model = get_model(self.model)
    # into new tensors: a checkpoint that fails to read leaves the learner as it was
    tensors = dict(model={k: torch.empty_like(v) for k,v in model.state_dict().items()})
    if state['opt'] is not None: tensors['opt'] = _opt_tensors(self.opt, md, state['opt_devices'])
    _dcp_load(tensors, path, **_dist_kw())
    model.load_state_dict(tensors['model'])
    if state['opt'] is not None: self.opt.load_state_dict(_join(state['opt'], '', tensors['opt']))
    self.opt.freeze_to(state['frozen_idx'])
    scaler = getattr(self.accelerator, 'scaler', None) if self.accelerator is not None else None
    if scaler is not None and state['scaler'] is not None: scaler.load_state_dict(state['scaler'])
    self._restore_recorder(state['recorder'])
    if with_rng: _set_rng_state(self, rng)
    return dict(state['position'], rng=rng, recorder=state['recorder'], world_size=state['world_size'])

def checkpoint_to_weights(
    ckpt:str|Path, # Checkpoint folder written by `save_state`/`CheckpointCallback`, on any number of processes
    fname:str|Path, # File to write, e.g. `learn.path/learn.model_dir/'model.pth'`
    with_opt:bool=True # Include the optimizer state, as `learn.save` does
)->Path:
    "Write the model (and optimizer) of sharded checkpoint `ckpt` as one file that `learn.load` and a plain fastai `Learner` read"
    ckpt,fname = Path(ckpt),Path(fname)
    state,md = _load(ckpt/'state.pt'),_metadata(ckpt)
    tensors = dict(model={k[6:]: _empty(m) for k,m in md.items() if k.startswith('model.')})
    if with_opt and state['opt'] is not None: tensors['opt'] = {k[4:]: _empty(m) for k,m in md.items() if k.startswith('opt.')}
    _dcp_load(tensors, ckpt, no_dist=True) # every tensor whole, in this process alone
    res = dict(model=tensors['model'], opt=_join(state['opt'], '', tensors['opt'])) if 'opt' in tensors else tensors['model']
    fname.parent.mkdir(parents=True, exist_ok=True)
    _atomic_save(res, fname)
    return fname

