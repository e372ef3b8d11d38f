"""The reference interpreter: a bytecode compiler (host) and interpreter (host and target).

It lives in the core package so that partial delegation's CPU fallback
(docs/writing-a-backend.md, "Partial delegation") works with nothing but
``pip install pytest-backendconf``; the ``backendconf-reference``
distribution is the delegate backend built on it. ``compiler`` is host
only; ``bytecode``, ``ops`` and ``interpreter`` are all a target needs. Its modules are imported by name
(``reference.compiler``, ``reference.interpreter``) so that a target never imports the compiler.

May import: the public surface only.
"""
