#!/usr/bin/env python3
"""Generates the training corpus of dsinfer's embedded default model (issue 17).

Deterministic from --seed; licence-clean: every sentence comes from the grammars
below and the word lists in words.py, both written for this project.

Output: JSONL, one example per line:
  {"task": str, "request": <Chat Completions request body>, "check": {...}}
  {"task": "text", "text": str}                       (plain text, no chat format)
The request's `messages` end with the assistant turn(s) the model is trained to
produce. tools/corpus/render_chat (C++) renders each request through dsinfer's own
protocol layer (parse_chat_completions_request + the V3.2 DSML encoder) and
tokenizer, so the training text is exactly what `dsinfer serve` sends the model.
`check` tells tools/eval how to score a generated answer on held-out examples.
"""
import argparse
import json
import random
import sys

import words as W

SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a helpful assistant. Answer briefly.",
    "You are a friendly assistant.",
    "You are a careful assistant. Think before you answer.",
    "You are a concise assistant.",
    "You are a helpful assistant that answers questions about stories, numbers and words.",
]


def maybe_system(r, msgs, p=0.6):
    if r.random() < p:
        msgs.insert(0, {"role": "system", "content": r.choice(SYSTEM_PROMPTS)})
    return msgs


def cap(s):
    return s[:1].upper() + s[1:]


def a_an(word):
    return ("an " if word[0] in "aeiou" else "a ") + word


# ----------------------------------------------------------------------------- stories

def story(r, hero=None, animal=None, thing=None, place=None, sentences=None):
    hero = hero or r.choice(W.NAMES)
    animal = animal or r.choice(list(W.ANIMALS) + W.MORE_ANIMALS)
    thing = thing or r.choice(W.THINGS)
    place = place or r.choice(W.PLACES)
    color = r.choice(W.COLORS)
    adj = r.choice(W.ADJECTIVES)
    adj2 = r.choice(W.ADJECTIVES)
    day = r.choice(W.DAYS)
    food = r.choice(W.FOODS)
    feeling = r.choice(W.FEELINGS)
    friend = r.choice([n for n in W.NAMES if n != hero])
    weather = r.choice(W.WEATHER)
    verb, det = r.choice(W.VERBS_PAST)
    opening = r.choice([
        f"Once upon a time, there was {a_an(adj)} {animal} named {hero}.",
        f"One {weather} {day}, {hero} went to the {place}.",
        f"{hero} lived near the {place} with {a_an(adj)} {animal}.",
        f"There was once {a_an(adj)} child called {hero} who loved {a_an(color)} {thing}.",
    ])
    middle = [
        f"{hero} {verb} {det} {color} {thing} near the {place}.",
        f"The {thing} was {adj2} and {color}.",
        f"{hero} showed the {thing} to {friend}.",
        f"{friend} said, \"What {a_an(adj2)} {thing}!\"",
        f"They sat under a tree and ate {food}s together.",
        f"The {animal} followed them all the way to the {r.choice(W.PLACES)}.",
        f"It was a {weather} day, so they stayed until the evening.",
        f"{hero} felt {feeling}.",
        f"Then a {r.choice(W.MORE_ANIMALS)} came out of the {r.choice(['grass', 'trees', 'water', 'hole', 'bushes'])}.",
        f"{friend} laughed and clapped {r.choice(['her', 'his'])} hands.",
    ]
    r.shuffle(middle)
    n = sentences or r.randint(3, 6)
    ending = r.choice([
        f"In the end, {hero} and {friend} went home {feeling}.",
        f"From that day on, {hero} kept the {thing} in a safe place.",
        f"And that is how {hero} made a new friend.",
        "The end.",
        f"{hero} smiled and said goodbye to the {place}.",
    ])
    return " ".join([opening] + middle[:n] + [ending]), dict(hero=hero, friend=friend,
                                                            thing=thing, place=place,
                                                            color=color, animal=animal)


def task_story(r):
    s, f = story(r)
    ask = r.choice([
        f"Tell me a short story about {a_an(f['animal'])}.",
        f"Write a short story about {f['hero']} and {a_an(f['thing'])}.",
        f"Can you tell me a story that happens at the {f['place']}?",
        "Tell me a short story.",
        "I want a bedtime story, please.",
    ])
    if "about a" in ask or "about an" in ask:
        s, f = story(r, animal=f["animal"])
    msgs = maybe_system(r, [{"role": "user", "content": ask},
                            {"role": "assistant", "content": s}])
    think = r.random() < 0.3
    if think:
        msgs[-1]["reasoning_content"] = (f"The user wants a short story. I will write about "
                                         f"{f['hero']} and keep it simple.")
    return {"task": "story", "request": req(msgs, think), "check": {"kind": "english"}}


def task_story_qa(r):
    s, f = story(r, sentences=r.randint(3, 5))
    q, a = r.choice([
        (f"What did {f['hero']} show to {f['friend']}?",
         f"{f['hero']} showed the {f['thing']} to {f['friend']}."),
        ("Who is the main character of the story?", f"The main character is {f['hero']}."),
        (f"What color was the {f['thing']}?", f"The {f['thing']} was {f['color']}."),
    ])
    if f"showed the {f['thing']}" not in s and "show" in q:
        q, a = "Who is the main character of the story?", f"The main character is {f['hero']}."
    if f"{f['color']} {f['thing']}" not in s and "color" in q:
        q, a = "Who is the main character of the story?", f"The main character is {f['hero']}."
    msgs = maybe_system(r, [{"role": "user", "content": f"Read this story.\n\n{s}\n\n{q}"},
                            {"role": "assistant", "content": a}])
    return {"task": "story_qa", "request": req(msgs, False),
            "check": {"kind": "contains", "answer": a.split()[-1].rstrip(".")}}


# ----------------------------------------------------------------------------- chat / facts

def task_chat(r):
    name = r.choice(W.NAMES)
    pairs = [
        ("Hi", "Hello! How can I help you today?"),
        ("Hello!", "Hi there! What would you like to talk about?"),
        ("How are you?", "I am doing well, thank you. How can I help you?"),
        ("Thank you!", "You are welcome! Let me know if you need anything else."),
        (f"My name is {name}.", f"Nice to meet you, {name}! How can I help you today?"),
        ("Who are you?", "I am a small assistant model served by dsinfer. I can answer simple "
                         "questions, do small sums, write short stories and call tools."),
        ("What can you do?", "I can answer simple questions, do small sums, count, copy text, "
                             "write short stories, answer in JSON and call tools."),
        ("Goodbye.", "Goodbye! Have a nice day."),
        ("Tell me a joke.", r.choice([
            "Why did the cat sit on the clock? Because it wanted to be on time.",
            "What do you call a sleepy bull? A bulldozer.",
            "Why did the cookie go to the doctor? Because it felt crummy."])),
        ("What day comes after " + (d := r.choice(W.DAYS)) + "?",
         f"The day after {d} is {W.DAYS[(W.DAYS.index(d) + 1) % 7]}."),
        ("What month comes after " + (m := r.choice(W.MONTHS)) + "?",
         f"The month after {m} is {W.MONTHS[(W.MONTHS.index(m) + 1) % 12]}."),
    ]
    u, a = r.choice(pairs)
    msgs = maybe_system(r, [{"role": "user", "content": u}, {"role": "assistant", "content": a}])
    return {"task": "chat", "request": req(msgs, False), "check": {"kind": "english"}}


def task_fact(r):
    kind = r.randrange(4)
    if kind == 0:
        a = r.choice(list(W.ANIMALS))
        q = r.choice([f"What sound does a {a} make?", f"What does a {a} say?"])
        ans, key = f"A {a} says {W.ANIMALS[a]}.", W.ANIMALS[a]
        reason = f"The user asks about the sound of a {a}. A {a} says {W.ANIMALS[a]}."
    elif kind == 1:
        w = r.choice(list(W.DEFINITIONS))
        q = r.choice([f"What is {a_an(w)}?", f"Define the word \"{w}\"."])
        ans, key = f"{cap(a_an(w))} is {W.DEFINITIONS[w]}.", W.DEFINITIONS[w].split()[-1]
        reason = f"I need to explain the word {w} in simple words."
    elif kind == 2:
        n = r.randint(0, 19)
        q = f"How do you write the number {n} in words?"
        ans, key = f"The number {n} is written \"{W.NUMBER_WORDS[n]}\".", W.NUMBER_WORDS[n]
        reason = f"{n} in words is {W.NUMBER_WORDS[n]}."
    else:
        n = r.randint(0, 19)
        q = f"Which number is \"{W.NUMBER_WORDS[n]}\"?"
        ans, key = f"\"{cap(W.NUMBER_WORDS[n])}\" is the number {n}.", str(n)
        reason = f"The word {W.NUMBER_WORDS[n]} means {n}."
    think = r.random() < 0.4
    msgs = maybe_system(r, [{"role": "user", "content": q}, {"role": "assistant", "content": ans}])
    if think:
        msgs[-1]["reasoning_content"] = reason
    return {"task": "fact", "request": req(msgs, think), "check": {"kind": "contains", "answer": key}}


# ----------------------------------------------------------------------------- checkable tasks

def task_arith(r):
    op = r.choice("+-*")
    if op == "+":
        a, b = r.randint(0, 99), r.randint(0, 99)
        c = a + b
    elif op == "-":
        a = r.randint(0, 99)
        b = r.randint(0, a)
        c = a - b
    else:
        a, b = r.randint(0, 12), r.randint(0, 12)
        c = a * b
    sym = {"+": "+", "-": "-", "*": "*"}[op]
    word = {"+": "plus", "-": "minus", "*": "times"}[op]
    q = r.choice([f"What is {a} {sym} {b}?", f"What is {a} {word} {b}?",
                  f"Compute {a} {sym} {b}.", f"{a} {sym} {b} = ?"])
    think = r.random() < 0.5
    ans = r.choice([f"{a} {sym} {b} = {c}.", f"The answer is {c}."])
    msgs = maybe_system(r, [{"role": "user", "content": q}, {"role": "assistant", "content": ans}])
    if think:
        if op == "+" and a >= 10 and b >= 10:
            t = (a // 10 + b // 10) * 10
            steps = (f"First add the tens: {a // 10 * 10} + {b // 10 * 10} = {t}. Then add the "
                     f"ones: {a % 10} + {b % 10} = {a % 10 + b % 10}. {t} + {a % 10 + b % 10} = {c}.")
        else:
            steps = f"{a} {word} {b} is {c}."
        msgs[-1]["reasoning_content"] = f"I need to compute {a} {sym} {b}. {steps}"
    return {"task": "arith", "request": req(msgs, think), "check": {"kind": "number", "answer": c}}


def task_count(r):
    kind = r.randrange(3)
    if kind == 0:
        items = r.sample(W.THINGS + W.FOODS, r.randint(1, 9))
        q = f"How many words are in this list: {', '.join(items)}?"
        c = len(items)
        ans = f"There are {c} words in the list."
        reason = " ".join(f"{i + 1} {w}." for i, w in enumerate(items))
    elif kind == 1:
        target = r.choice(list(W.ANIMALS)[:8])
        seq = [r.choice(list(W.ANIMALS)[:8]) for _ in range(r.randint(3, 10))]
        c = seq.count(target)
        q = f"How many times does the word \"{target}\" appear in: {' '.join(seq)}"
        ans = f"The word \"{target}\" appears {c} times."
        reason = f"I look for {target}: " + " ".join(
            ("yes" if w == target else "no") for w in seq) + f". That is {c}."
    else:
        w = r.choice(W.THINGS + W.FOODS + list(W.ANIMALS))
        c = len(w)
        q = f"How many letters are in the word \"{w}\"?"
        ans = f"The word \"{w}\" has {c} letters."
        reason = " ".join(f"{i + 1} {ch}." for i, ch in enumerate(w))
    think = r.random() < 0.5
    msgs = maybe_system(r, [{"role": "user", "content": q}, {"role": "assistant", "content": ans}])
    if think:
        msgs[-1]["reasoning_content"] = f"Let me count. {reason}"
    return {"task": "count", "request": req(msgs, think), "check": {"kind": "number", "answer": c}}


def task_copy(r):
    pool = W.THINGS + W.FOODS + W.COLORS + list(W.ANIMALS) + W.NAMES[:20]
    items = [r.choice(pool) for _ in range(r.randint(2, 8))]
    kind = r.randrange(4)
    if kind == 0:
        text = " ".join(items)
        q = r.choice([f"Repeat exactly: {text}", f"Copy this text: {text}",
                      f"Say this back to me: {text}"])
        out = text
    elif kind == 1:
        q = f"Reverse this list: {', '.join(items)}"
        out = ", ".join(reversed(items))
    elif kind == 2:
        text = " ".join(items)
        q = f"Write this in capital letters: {text}"
        out = text.upper()
    else:
        q = f"Sort these words alphabetically: {', '.join(items)}"
        out = ", ".join(sorted(items))
    msgs = maybe_system(r, [{"role": "user", "content": q}, {"role": "assistant", "content": out}])
    return {"task": "copy", "request": req(msgs, False), "check": {"kind": "exact", "answer": out}}


def task_lookup(r):
    people = r.sample(W.NAMES, r.randint(3, 5))
    cities = r.sample(W.CITIES, len(people))
    ages = [r.randint(5, 90) for _ in people]
    pets = [r.choice(list(W.ANIMALS)) for _ in people]
    facts = [f"{p} is {a} years old, lives in {c} and has a {pet}."
             for p, a, c, pet in zip(people, ages, cities, pets)]
    i = r.randrange(len(people))
    kind = r.randrange(3)
    if kind == 0:
        q, ans, key = f"Where does {people[i]} live?", f"{people[i]} lives in {cities[i]}.", cities[i]
    elif kind == 1:
        q, ans, key = f"How old is {people[i]}?", f"{people[i]} is {ages[i]} years old.", str(ages[i])
    else:
        q, ans, key = f"What pet does {people[i]} have?", f"{people[i]} has a {pets[i]}.", pets[i]
    ctx = "\n".join(facts)
    if r.random() < 0.5:
        msgs = [{"role": "system", "content": f"You are a helpful assistant. Facts:\n{ctx}"},
                {"role": "user", "content": q}]
    else:
        msgs = [{"role": "user", "content": f"{ctx}\n\n{q}"}]
    think = r.random() < 0.4
    msgs.append({"role": "assistant", "content": ans})
    if think:
        msgs[-1]["reasoning_content"] = f"The facts say: {facts[i]} So the answer is {key}."
    return {"task": "lookup", "request": req(msgs, think), "check": {"kind": "contains", "answer": key}}


# ----------------------------------------------------------------------------- JSON answers

def task_json(r):
    kind = r.randrange(4)
    name = r.choice(W.NAMES)
    if kind == 0:
        age = r.randint(3, 90)
        city = r.choice(W.CITIES)
        text = r.choice([f"{name} is {age} years old and lives in {city}.",
                         f"Meet {name} from {city}. {name} is {age}."])
        schema = {"type": "object", "properties": {"name": {"type": "string"},
                                                   "age": {"type": "integer"},
                                                   "city": {"type": "string"}},
                  "required": ["name", "age", "city"]}
        obj = {"name": name, "age": age, "city": city}
        q = f"Extract the person from this text as JSON: {text}"
    elif kind == 1:
        items = r.sample(W.FOODS, r.randint(1, 4))
        schema = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"}},
                                                   "count": {"type": "integer"}},
                  "required": ["items", "count"]}
        obj = {"items": items, "count": len(items)}
        q = f"{name} bought {', '.join(items)}. List the items and how many there are."
    elif kind == 2:
        a, b = r.randint(0, 50), r.randint(0, 50)
        schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
                                                   "sum": {"type": "integer"}},
                  "required": ["a", "b", "sum"]}
        obj = {"a": a, "b": b, "sum": a + b}
        q = f"Add {a} and {b}. Give the inputs and the sum."
    else:
        animal = r.choice(list(W.ANIMALS))
        schema = {"type": "object", "properties": {"animal": {"type": "string"},
                                                   "sound": {"type": "string"},
                                                   "is_pet": {"type": "boolean"}},
                  "required": ["animal", "sound", "is_pet"]}
        is_pet = animal in ("dog", "cat", "mouse", "duck", "chicken")
        obj = {"animal": animal, "sound": W.ANIMALS[animal], "is_pet": is_pet}
        q = f"Describe the {animal}: its sound and whether people keep it as a pet."
    use_schema = r.random() < 0.75
    if use_schema:
        rf = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    else:
        rf = {"type": "json_object"}
        q += " Answer in JSON with the keys " + ", ".join(obj) + "."
    content = json.dumps(obj, ensure_ascii=False)
    msgs = maybe_system(r, [{"role": "user", "content": q}, {"role": "assistant", "content": content}])
    think = r.random() < 0.3
    if think:
        msgs[-1]["reasoning_content"] = "I will answer with a JSON object that has " + \
            ", ".join(obj) + "."
    body = req(msgs, think)
    body["response_format"] = rf
    return {"task": "json", "request": body,
            "check": {"kind": "json", "schema": schema, "answer": obj}}


# ----------------------------------------------------------------------------- tools

def tool(name, desc, params, required=None):
    return {"type": "function", "function": {
        "name": name, "description": desc,
        "parameters": {"type": "object", "properties": params,
                       "required": required if required is not None else list(params)}}}


TOOLS = {
    "get_weather": tool("get_weather", "Get the current weather in a city.",
                        {"city": {"type": "string", "description": "The city name"}}),
    "get_time": tool("get_time", "Get the current local time in a city.",
                     {"city": {"type": "string"}}),
    "add": tool("add", "Add two integers.", {"a": {"type": "integer"}, "b": {"type": "integer"}}),
    "multiply": tool("multiply", "Multiply two integers.",
                     {"a": {"type": "integer"}, "b": {"type": "integer"}}),
    "search_books": tool("search_books", "Search the library for books about a topic.",
                         {"topic": {"type": "string"},
                          "max_results": {"type": "integer"}}, ["topic"]),
    "send_email": tool("send_email", "Send an email.",
                       {"to": {"type": "string"}, "subject": {"type": "string"},
                        "body": {"type": "string"}}),
    "convert_currency": tool("convert_currency", "Convert an amount of money.",
                             {"amount": {"type": "number"}, "from": {"type": "string"},
                              "to": {"type": "string"}}),
    "get_population": tool("get_population", "Get the population of a city.",
                           {"city": {"type": "string"}}),
    "set_timer": tool("set_timer", "Start a timer.", {"minutes": {"type": "integer"},
                                                      "label": {"type": "string"}}, ["minutes"]),
    "translate": tool("translate", "Translate a short text.",
                      {"text": {"type": "string"}, "language": {"type": "string"}}),
}
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF", "CAD"]
LANGUAGES = ["French", "Spanish", "German", "Italian", "Japanese"]


def tool_scenario(r):
    """One (tool name, arguments, user request, tool result, final answer)."""
    t = r.choice(list(TOOLS))
    city = r.choice(W.CITIES)
    if t == "get_weather":
        w, deg = r.choice(W.WEATHER), r.randint(-5, 35)
        return (t, {"city": city}, r.choice([f"What is the weather in {city}?",
                                              f"Is it sunny in {city} today?",
                                              f"How is the weather in {city} right now?"]),
                {"city": city, "weather": w, "temperature_c": deg},
                f"It is {w} in {city} and {deg} degrees Celsius.")
    if t == "get_time":
        h, m = r.randint(0, 23), r.randint(0, 59)
        return (t, {"city": city}, f"What time is it in {city}?", {"city": city, "time": f"{h:02d}:{m:02d}"},
                f"It is {h:02d}:{m:02d} in {city}.")
    if t in ("add", "multiply"):
        a, b = r.randint(100, 9999), r.randint(100, 9999)
        c = a + b if t == "add" else a * b
        word = "plus" if t == "add" else "times"
        return (t, {"a": a, "b": b}, r.choice([f"Use the tool to compute {a} {word} {b}.",
                                                f"What is {a} {word} {b}? Use a tool."]),
                {"result": c}, f"{a} {word} {b} is {c}.")
    if t == "search_books":
        topic = r.choice(list(W.ANIMALS) + W.SPORTS + W.INSTRUMENTS)
        n = r.randint(1, 5)
        titles = [f"The {cap(r.choice(W.ADJECTIVES))} {cap(topic)}" for _ in range(2)]
        args = {"topic": topic, "max_results": n} if r.random() < 0.5 else {"topic": topic}
        ask = (f"Find {n} books about {topic}." if "max_results" in args
               else f"Find books about {topic}.")
        return (t, args, ask, {"books": titles},
                f"I found these books about {topic}: {titles[0]} and {titles[1]}.")
    if t == "send_email":
        to = r.choice(W.NAMES).lower() + "@example.com"
        subj = r.choice(["Lunch", "Meeting", "Hello", "The party", "Homework"])
        body = r.choice(["See you at noon.", "The meeting is on " + r.choice(W.DAYS) + ".",
                         "Thank you for the " + r.choice(W.THINGS) + "."])
        return (t, {"to": to, "subject": subj, "body": body},
                f"Send an email to {to} with the subject \"{subj}\" saying: {body}",
                {"status": "sent"}, f"The email to {to} was sent.")
    if t == "convert_currency":
        amt = r.randint(1, 500)
        f, to = r.sample(CURRENCIES, 2)
        out = round(amt * r.uniform(0.5, 1.5), 2)
        return (t, {"amount": amt, "from": f, "to": to}, f"How much is {amt} {f} in {to}?",
                {"amount": out, "currency": to}, f"{amt} {f} is {out} {to}.")
    if t == "get_population":
        p = r.randint(100, 20000) * 1000
        return (t, {"city": city}, f"How many people live in {city}?", {"city": city, "population": p},
                f"About {p} people live in {city}.")
    if t == "set_timer":
        mins = r.randint(1, 90)
        label = r.choice(["tea", "pasta", "break", "homework", "bread"])
        args = {"minutes": mins, "label": label} if r.random() < 0.5 else {"minutes": mins}
        ask = (f"Set a timer for {mins} minutes for the {label}." if "label" in args
               else f"Set a timer for {mins} minutes.")
        return (t, args, ask, {"status": "started", "minutes": mins},
                f"The timer is set for {mins} minutes.")
    text = r.choice(["good morning", "thank you", "where is the station", "I like apples"])
    lang = r.choice(LANGUAGES)
    return (t, {"text": text, "language": lang}, f"Translate \"{text}\" into {lang}.",
            {"translation": f"[{lang} text]"}, f"In {lang}, \"{text}\" is: [{lang} text].")


def task_tool(r):
    name, args, ask, result, final = tool_scenario(r)
    others = [t for t in TOOLS if t != name]
    offered = r.sample(others, r.randint(0, 2)) + [name]
    r.shuffle(offered)
    think = r.random() < 0.5
    msgs = maybe_system(r, [{"role": "user", "content": ask}])
    call = {"id": "call_0", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}
    a1 = {"role": "assistant", "content": "", "tool_calls": [call]}
    if think:
        a1["reasoning_content"] = f"The user asks: {ask} I should call {name}."
    msgs.append(a1)
    msgs.append({"role": "tool", "tool_call_id": "call_0",
                 "content": json.dumps(result, ensure_ascii=False)})
    a2 = {"role": "assistant", "content": final}
    if think:
        a2["reasoning_content"] = f"The tool returned the result. {final}"
    msgs.append(a2)
    body = req(msgs, think)
    body["tools"] = [TOOLS[t] for t in offered]
    return {"task": "tool", "request": body,
            "check": {"kind": "tool_call", "name": name, "arguments": args}}


def task_tool_parallel(r):
    t = r.choice(["get_weather", "get_time", "get_population"])
    c1, c2 = r.sample(W.CITIES, 2)
    what = {"get_weather": "weather", "get_time": "time", "get_population": "population"}[t]
    ask = f"What is the {what} in {c1} and in {c2}?"
    msgs = maybe_system(r, [{"role": "user", "content": ask}])
    calls = [{"id": f"call_{i}", "type": "function",
              "function": {"name": t, "arguments": json.dumps({"city": c})}}
             for i, c in enumerate((c1, c2))]
    msgs.append({"role": "assistant", "content": "", "tool_calls": calls})
    vals = []
    for i, c in enumerate((c1, c2)):
        if t == "get_weather":
            v = r.choice(W.WEATHER)
            res = {"city": c, "weather": v, "temperature_c": r.randint(-5, 35)}
        elif t == "get_time":
            v = f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}"
            res = {"city": c, "time": v}
        else:
            v = str(r.randint(100, 20000) * 1000)
            res = {"city": c, "population": int(v)}
        vals.append(v)
        msgs.append({"role": "tool", "tool_call_id": f"call_{i}", "content": json.dumps(res)})
    msgs.append({"role": "assistant",
                 "content": f"The {what} in {c1} is {vals[0]}, and in {c2} it is {vals[1]}."})
    body = req(msgs, False)
    body["tools"] = [TOOLS[t]] + [TOOLS[x] for x in r.sample([x for x in TOOLS if x != t], 1)]
    return {"task": "tool", "request": body,
            "check": {"kind": "tool_call", "name": t, "arguments": {"city": c1}}}


def task_no_tool(r):
    """Tools are offered but the question does not need one: answer directly."""
    ex = r.choice([task_arith, task_fact, task_chat])(r)
    body = ex["request"]
    body["tools"] = [TOOLS[t] for t in r.sample(list(TOOLS), r.randint(1, 3))]
    ex["task"] = "no_tool"
    return ex


def task_multiturn(r):
    a, b = r.randint(1, 20), r.randint(1, 20)
    hero = r.choice(W.NAMES)
    animal = r.choice(list(W.ANIMALS))
    msgs = maybe_system(r, [
        {"role": "user", "content": f"My friend {hero} has {a} {W.ANIMAL_PLURAL.get(animal, animal + 's')}."},
        {"role": "assistant", "content": f"That is a lot of animals! {hero} must be busy."},
        {"role": "user", "content": f"Now {hero} gets {b} more. How many does {hero} have?"},
        {"role": "assistant", "content": f"{hero} has {a} + {b} = {a + b} now."},
    ])
    if r.random() < 0.5:
        msgs += [{"role": "user", "content": "What kind of animal are they?"},
                 {"role": "assistant", "content": f"They are {W.ANIMAL_PLURAL.get(animal, animal + 's')}."}]
        check = {"kind": "contains", "answer": W.ANIMAL_PLURAL.get(animal, animal + "s")}
    else:
        check = {"kind": "number", "answer": a + b}
    think = r.random() < 0.3
    if think:
        msgs[-1]["reasoning_content"] = "I look back at the conversation to answer."
    return {"task": "multiturn", "request": req(msgs, think), "check": check}


def task_text(r):
    return {"task": "text", "text": "\n\n".join(story(r)[0] for _ in range(r.randint(1, 3)))}


def req(messages, thinking):
    body = {"model": "dsinfer-default", "messages": messages}
    if thinking:
        body["thinking"] = {"type": "enabled"}
    return body


TASKS = [  # (function, weight)
    (task_story, 8), (task_story_qa, 5), (task_chat, 6), (task_fact, 8), (task_arith, 12),
    (task_count, 8), (task_copy, 9), (task_lookup, 8), (task_json, 12), (task_tool, 14),
    (task_tool_parallel, 2), (task_no_tool, 3), (task_multiturn, 5), (task_text, 4),
]


def generate(seed, n, only=None):
    r = random.Random(seed)
    fns = [f for f, _ in TASKS if only is None or f.__name__ == "task_" + only]
    weights = [w for f, w in TASKS if only is None or f.__name__ == "task_" + only]
    for _ in range(n):
        yield r.choices(fns, weights)[0](r)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--n", type=int, default=1000, help="examples")
    ap.add_argument("--only", help="one task family (e.g. arith)")
    ap.add_argument("--out", default="-")
    a = ap.parse_args()
    out = sys.stdout if a.out == "-" else open(a.out, "w", encoding="utf-8")
    for ex in generate(a.seed, a.n, a.only):
        out.write(json.dumps(ex, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
