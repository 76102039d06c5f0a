"""daskvec's benchmarks that are not for users: they stay in the source repository.

The installed package holds ``daskvec bench``'s user-facing scenarios (:mod:`daskvec.bench`);
these need root, a browser or daskvec's internals, or measure daskvec against itself.
``daskvec bench --scenario <name>`` runs them from a source checkout.
"""
