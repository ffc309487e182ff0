import sys

from experiments.bench import main

sys.exit(main())
