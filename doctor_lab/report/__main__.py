import sys

from doctor_lab.report.build import main

sys.exit(main())
