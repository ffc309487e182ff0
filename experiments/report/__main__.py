import sys

from experiments.report import main

sys.exit(main())
