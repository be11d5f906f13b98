import os
import sys

# The tests import world.py and their worker modules by name, in spawned
# processes too (spawn passes sys.path on).
sys.path.insert(0, os.path.dirname(__file__))
