"""Write made-up hourly temperature readings of one station: `fetch.py SEED OUT`.
One reading in 17 is the sensor's error value, -999, for the workflow to clean up."""

import random
import sys

seed, out = int(sys.argv[1]), sys.argv[2]
rng = random.Random(seed)
with open(out, "w") as f:
    for hour in range(24 * 14):
        temp = -999 if rng.randrange(17) == 0 else round(8 + 6 * rng.random() + seed, 1)
        f.write(f"{hour},{temp}\n")
