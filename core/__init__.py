"""The storage engine: files and bytes, never sockets or processes (DESIGN §4).

numba, which only this package imports, is told before its first import here
not to colour its error messages (NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING):
its colouring wraps and unwraps ``sys.stdout`` with colorama around every
message it formats, including the typing messages of a successful compile,
so a compile in a client's background thread (a direct reader warming its
kernels) put back the ``sys.stdout`` of some earlier moment under a
``contextlib.redirect_stdout`` in the main thread, and the user's output
went to the wrong stream. A user who sets the variable keeps their value.
"""
import os as _os

_os.environ.setdefault("NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING", "1")
