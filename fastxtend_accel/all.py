"Everything in fastxtend_accel: `from fastxtend_accel.all import *`"
from .core import *
from .fsdp import *
from .compiler import *
from .state import *
from .checkpoint import *
