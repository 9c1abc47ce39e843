# Setup: run this cell first. Where the lab is installed (JupyterLab) it imports labsupport; in
# Colab it first installs the lab's helper package from LAB_URL (torch is already there).
LAB_URL = ""  # where labsupport installs from; written by the instructor's `release --student-url`
import importlib, importlib.util, subprocess, sys
if importlib.util.find_spec("labsupport") is None:  # Colab, or a kernel without the lab installed
    if not LAB_URL:
        raise RuntimeError("labsupport is not installed and this notebook has no LAB_URL to install it "
                           "from. Students: start JupyterLab from the lab's .venv (see README.md), or ask "
                           "your instructor for the lab's install link. Instructors: python -m autograder "
                           "release --student-url URL (a git+https:// repository, zip or wheel of build/student).")
    import importlib.metadata as md  # Colab's own torch is used if it is new enough: never replaced
    have = md.version("torch") if importlib.util.find_spec("torch") else None
    if have and tuple(int(p) for p in have.split("+")[0].split(".")[:2]) < (2, 11):
        raise RuntimeError(f"This runtime's torch is {have}; the lab needs 2.11 or newer. Run "
                           "`!pip install -U torch torchvision` in a cell, then Runtime > Restart session, "
                           "and run this cell again (or pick a newer runtime version).")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", LAB_URL], check=True)
    importlib.invalidate_caches()  # so this kernel sees the package pip just installed
import labsupport as ls
lab = ls.setup()
