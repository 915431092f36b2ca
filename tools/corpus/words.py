"""Word lists for the generated corpus (written for this project; no external source).

A small closed world: people, animals, things, places, foods, colours, and the
facts the generator states about them. Everything the model learns is derived
from these lists by the grammars in gen_corpus.py.
"""

NAMES = """Alice Bob Carol David Emma Frank Grace Henry Ivy Jack Kate Leo Mia Noah Olivia
Paul Quinn Rose Sam Tina Uma Victor Wendy Xavier Yara Zoe Adam Bella Chris Daisy Ethan Fiona
George Hannah Isaac Julia Kevin Lily Mark Nina Oscar Penny Ruby Simon Tara Umar Vera Will Amy
Ben Clara Dan Ella Finn Gina Hugo Iris Jake Lucy Max Nora Owen Pia Ray Sara Tom Una Vince
Wanda Yusuf Zara Anna Ivan Lena Omar Maya Theo Nadia Felix""".split()

ANIMALS = {
    "dog": "woof", "cat": "meow", "cow": "moo", "duck": "quack", "sheep": "baa",
    "horse": "neigh", "pig": "oink", "lion": "roar", "owl": "hoot", "frog": "croak",
    "bee": "buzz", "mouse": "squeak", "goat": "bleat", "snake": "hiss", "wolf": "howl",
    "chicken": "cluck", "donkey": "bray", "crow": "caw", "dove": "coo", "bear": "growl",
}
ANIMAL_PLURAL = {a: (a + "s") for a in ANIMALS}
ANIMAL_PLURAL.update({"sheep": "sheep", "mouse": "mice", "fox": "foxes"})
MORE_ANIMALS = """rabbit fox deer turtle fish bird squirrel whale dolphin tiger elephant
monkey zebra camel panda koala otter seal penguin parrot""".split()

COLORS = """red blue green yellow orange purple pink brown black white gray gold silver""".split()

THINGS = """ball box book cup hat kite lamp map pen key bag coat shoe sock chair table bed
clock phone bottle basket bell boat bike brush candle card coin drum flag glove jar ladder
mirror necklace note pillow plate ring rope scarf shell spoon stone toy train umbrella vase
wagon watch whistle blanket bucket button camera feather flower leaf letter marble paper
pencil puzzle ribbon robot rocket sled spade stick sticker stool tent ticket torch tray
trumpet violin window wheel""".split()

PLACES = """park garden forest river lake beach hill village town city farm market school
library kitchen castle island bridge meadow valley mountain harbor station museum bakery
cave field pond zoo playground""".split()

CITIES = """Paris London Tokyo Berlin Madrid Rome Cairo Lima Oslo Dublin Vienna Prague
Lisbon Athens Seoul Delhi Sydney Toronto Nairobi Bogota Warsaw Helsinki Istanbul Chicago
Boston Denver Austin Seattle Miami Quito""".split()

FOODS = """apple bread cake cheese cookie egg grape honey jam lemon mango milk noodle orange
pear pie pizza plum rice salad soup tea carrot potato tomato banana cherry peach muffin
pancake sandwich""".split()

ADJECTIVES = """big small happy sad quiet loud brave kind clever shy old young tall short
bright dark warm cold soft hard fast slow gentle busy lazy funny tiny huge proud calm
curious friendly sleepy hungry lucky shiny noisy tidy messy""".split()

FEELINGS = """happy sad excited tired surprised proud calm worried glad curious""".split()

VERBS_PAST = [
    ("found", "a"), ("lost", "the"), ("painted", "a"), ("carried", "the"), ("hid", "the"),
    ("built", "a"), ("dropped", "the"), ("shared", "the"), ("washed", "the"), ("fixed", "the"),
    ("bought", "a"), ("made", "a"), ("opened", "the"), ("cleaned", "the"), ("kicked", "the"),
]

WEATHER = ["sunny", "rainy", "cloudy", "windy", "snowy", "foggy", "stormy", "clear"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = """January February March April May June July August September October November
December""".split()
JOBS = """teacher doctor baker farmer pilot painter singer driver nurse cook writer tailor
builder gardener dentist""".split()
SPORTS = """football tennis chess swimming running cycling skating golf hockey climbing""".split()
INSTRUMENTS = """piano guitar violin drum flute trumpet harp cello""".split()

NUMBER_WORDS = """zero one two three four five six seven eight nine ten eleven twelve thirteen
fourteen fifteen sixteen seventeen eighteen nineteen twenty""".split()

# Short definitions (written here) for the "what is" questions.
DEFINITIONS = {
    "apple": "a round fruit that grows on trees",
    "river": "a long stream of water that flows to the sea",
    "library": "a place where people borrow books",
    "kite": "a light toy that flies in the wind on a string",
    "bakery": "a shop where bread and cakes are made",
    "bridge": "a path built over a river or a road",
    "clock": "a machine that shows the time",
    "island": "a piece of land with water all around it",
    "farm": "a place where people grow food and keep animals",
    "umbrella": "a cover that keeps you dry in the rain",
    "candle": "a stick of wax that gives light when it burns",
    "map": "a picture that shows where places are",
    "ladder": "a set of steps you can carry and climb",
    "mirror": "a glass that shows your own picture",
    "harbor": "a place where boats stay safe from the sea",
    "meadow": "a field of grass and flowers",
    "thermometer": "a tool that measures how hot or cold something is",
    "robot": "a machine that can do some jobs by itself",
    "volcano": "a mountain that can throw out hot rock",
    "rainbow": "a curve of colors in the sky after rain",
    "compass": "a tool that shows which way is north",
    "museum": "a building where old and special things are shown",
    "orchestra": "a large group of people who play music together",
    "desert": "a dry land with very little rain",
    "planet": "a large round world that moves around a star",
    "pilot": "a person who flies a plane",
    "teacher": "a person who helps people learn",
    "cheese": "a food made from milk",
    "honey": "a sweet food made by bees",
    "glove": "a cover for your hand",
}
