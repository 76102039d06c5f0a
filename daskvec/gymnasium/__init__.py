"""Gymnasium: the ``VectorEnv`` face.

- :mod:`daskvec.gymnasium.vector_env`: :class:`~daskvec.DaskVectorEnv` and
  :func:`~daskvec.make_vec`, Gymnasium's ``VectorEnv`` API with ``AsyncVectorEnv``'s split
  calls and state rules, and EnvPool's partial batches (``send``/``recv``);
- :mod:`daskvec.gymnasium.buffers`: :class:`~daskvec.gymnasium.buffers.VectorBuffers`,
  the one place replies become Gymnasium's batched observations and infos;
- :mod:`daskvec.gymnasium.layout`: the face's arguments, checked with Gymnasium's own
  errors, and how a batch maps to envs and groups.

Import the face from the top level: ``from daskvec import DaskVectorEnv, make_vec``.
"""
