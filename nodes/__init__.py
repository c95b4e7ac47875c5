"""Node classes; one file per node family."""
from .compile import VAEKitCompile
from .framewise import VAEKitFramewiseDecode
from .loader import VAEKitLoad
from .tiled import VAEKitTiledDecode, VAEKitTiledEncode

NODES = (VAEKitLoad, VAEKitTiledEncode, VAEKitTiledDecode, VAEKitFramewiseDecode, VAEKitCompile)
NODE_CLASS_MAPPINGS = {cls.__name__: cls for cls in NODES}
NODE_DISPLAY_NAME_MAPPINGS = {cls.__name__: cls.DISPLAY_NAME for cls in NODES}
