"""A local package of env code that the Dask workers cannot import (tests of by-value pickling)."""
