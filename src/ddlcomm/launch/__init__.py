"""Starting ranks: launcher detection (env.py) and starting a launcher (mpirun.py)."""
