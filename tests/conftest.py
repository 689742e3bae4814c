import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("CI", "1")  # no progress bars in tests
