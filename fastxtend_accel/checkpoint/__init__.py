"Checkpoints: `CheckpointCallback`, the checkpoint folder (`Learner.save_state`/`load_state`), exact resume, stores"
# One module each, in the book's order (nbs/10_codec to nbs/16_checkpoint); each exports what its notebook does.
# `stores`' names (`upload`, `as_path`...) stay in their module, as they did in `fastxtend_accel.all`
from . import codec, rng, fields, stores, dcp_io, checksums, state, resume, signals, callback
from .codec import *
from .rng import *
from .fields import *
from .dcp_io import *
from .checksums import *
from .state import *
from .resume import *
from .signals import *
from .callback import *

__all__ = [n for m in (codec, rng, fields, dcp_io, checksums, state, resume, signals, callback) for n in m.__all__]
