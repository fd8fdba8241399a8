"""The denoiser web app's launcher: `python app.py [--host 127.0.0.1] [--port 7860] [--share] [--weights FOLDER]`.

The same as `denoiser app`; the app itself is the package module `denoiser.app`.
"""

from denoiser.app import main

if __name__ == "__main__":
    main()
