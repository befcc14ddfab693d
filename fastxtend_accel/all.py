"Everything in fastxtend_accel, for `from fastxtend_accel.all import *` (each module's own names, in the book's order)"
from .core import *
from .accelerator import *
from .fsdp import *
from .fsdp_values import *
from .xla import *
from .compiler import *
from .codec import *
from .rng import *
from .fields import *
from .dcp_io import *
from .checksums import *
from .state import *
from .resume import *
from .checkpoint import *
from .monitors import *
from .trackers import *
from .profiler import *
