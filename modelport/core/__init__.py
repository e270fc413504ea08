"""The plain-Python core of the portal: model formats (detection, inspection, serving facts) and their backend
wrappers, archives and their limits, signatures and datatypes, the runtime env and running code in it, the
sandbox, requirement lines, and the exceptions the layers above share.

Nothing here imports Django: the apps above pass settings in as arguments and act on what these functions return.
"""
