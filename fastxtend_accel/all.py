"Everything in fastxtend_accel, for `from fastxtend_accel.all import *` (each module's own names, in the book's order)"
from .core import *
from .accelerator import *
from .fsdp import *
from .fsdp_values import *
from .sharded_init import *
from .xla import *
from .compiler import *
from .checkpoint import *
from .requeue import run_requeueable, requeue_cmd, sbatch_script
from .watchdog import *
from .monitors import *
from .trackers import *
from .profiler import *
from .ema import *
from .guard import *
from .activations import *
from .microbatch import *
