# Setup: run this cell first. In a checkout of the lab it only imports labsupport; in Colab it
# clones the lab's repository and installs it (torch is already there), then generates the data.
LAB_REPO = "https://github.com/your-org/pytorch-performance-lab.git"  # the lab's repository: set here only
import importlib.util, os, subprocess, sys
if importlib.util.find_spec("labsupport") is None:  # Colab, or a kernel outside the lab's .venv
    checkout = os.path.expanduser("~/pytorch-performance-lab")
    if not os.path.isdir(checkout):
        subprocess.run(["git", "clone", "--depth", "1", LAB_REPO, checkout], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "-e", checkout], check=True)
    sys.path.insert(0, checkout)  # this kernel cannot see the editable install until it restarts
import labsupport as ls
lab = ls.setup()
