"""What the client and the workers say to each other.

- :mod:`~daskvec.protocol.messages`: the commands, the group's spec and description,
  the replies to steps and resets, remote errors;
- :mod:`~daskvec.protocol.rollout_records`: the records of worker-side collections
  (the request, the observation pipeline, the fragment sent back).

How these travel (framing, the compact step record, shared memory) is
:mod:`daskvec.transport`'s business, not this package's. The workers import it: it
imports only NumPy and Gymnasium's spaces.
"""
