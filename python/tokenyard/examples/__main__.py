"""``python -m tokenyard.examples`` prints the folder of the shipped example configs."""

from tokenyard.examples import FOLDER

print(FOLDER)
